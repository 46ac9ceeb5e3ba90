"""Context parallelism on the local spec (CPU): CP=2 equals one process, with learned and
rotary position embeddings — the loss of later steps checks the gradients through the K/V
all-gather too."""

from __future__ import annotations

import pytest

from megatron_lgs.context_parallel import local_positions
from tests.conftest import run_pretrain

pytestmark = pytest.mark.slow

RUN = ["--train-iters", "3", "--eval-iters", "0", "--log-interval", "1"]


@pytest.mark.parametrize("position", ["learned_absolute", "rope"])
def test_cp2_loss_equals_one_process(tiny, tmp_path, position):
    args = [*tiny, *RUN, "--position-embedding-type", position]
    reference = run_pretrain(args, save_dir=tmp_path / "one").losses()
    cp2 = run_pretrain([*args, "--context-parallel-size", "2"], nproc=2,
                       save_dir=tmp_path / "cp2").losses()
    assert len(reference) == 3 and reference[-1] < reference[0]
    assert cp2 == pytest.approx(reference, abs=1e-4, rel=0)


def test_each_rank_holds_two_balanced_chunks():
    held = [local_positions(16, 2, r).tolist() for r in range(2)]
    assert held == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
