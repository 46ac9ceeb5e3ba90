"""On a GPU with Transformer Engine: the default spec there (TE) trains in BF16. Skipped where
CUDA or Transformer Engine is absent (tests/gpu/test_gpu_local.py covers the local spec)."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_lgs.platform import get_platform
from tests.conftest import run_pretrain

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not get_platform().te_available,
    reason="needs a CUDA GPU with Transformer Engine")


def test_transformer_engine_spec_trains_in_bf16(tiny, tmp_path):
    run = run_pretrain([*tiny, "--bf16", "--train-iters", "10"], save_dir=tmp_path / "ckpt")
    assert "transformer engine: yes" in run.stdout
    losses = run.losses()
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
