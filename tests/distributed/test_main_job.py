"""The README's main job: `pretrain_gpt.py` with no model or data flags, end to end."""

from __future__ import annotations

import pytest

from tests.conftest import run_pretrain

pytestmark = pytest.mark.slow


def test_embedded_default_run_learns_and_writes_a_checkpoint(data_cache, tmp_path):
    # Both cores, as `make run` has them (the other tests pin one thread to compare runs bitwise).
    run = run_pretrain(["--data-cache-dir", data_cache], save_dir=tmp_path / "ckpt",
                       env={"OMP_NUM_THREADS": "2"})
    valid = [r["loss"] for r in run.records("valid")]
    assert valid[-1] <= 0.7 * valid[0], valid  # at least 30% below the first validation
    assert len(run.losses()) == 400
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "400"
