"""On a GPU: the Transformer Engine spec trains in BF16. Skipped where CUDA is absent."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import run_pretrain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_transformer_engine_spec_trains_in_bf16(tiny, tmp_path):
    run = run_pretrain([*tiny, "--bf16", "--train-iters", "10"], save_dir=tmp_path / "ckpt")
    assert "transformer engine: yes" in run.stdout
    losses = run.losses()
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
