"""The suite's fork launcher (tests/forked_ranks.py) behaves as torchrun does for what the tests
read: the same losses bit for bit, the same exit status and message for a bad flag, and a
process group that fault injection can kill."""

from __future__ import annotations

import pytest

from megatron_lgs.checkpointing import FAULT_ENV
from tests.conftest import run_pretrain

pytestmark = pytest.mark.slow


def test_fork_launcher_equals_torchrun(tiny, tmp_path):
    args = [*tiny, "--train-iters", "3", "--use-distributed-optimizer", "--lgs"]
    runs = {launcher: run_pretrain(args, nproc=2, save_dir=tmp_path / launcher,
                                   launcher=launcher) for launcher in ("fork", "user")}
    assert len(runs["fork"].losses()) == 3
    assert runs["fork"].losses() == runs["user"].losses()
    # LGS reads the ranks per node from LOCAL_WORLD_SIZE, which both launchers set.
    for run in runs.values():
        assert "LGS: 2 ranks per node (LOCAL_WORLD_SIZE)" in run.stdout, run.stdout[-2000:]
        assert "= 1 nodes x 2" in run.stdout


@pytest.mark.parametrize("nproc", [1, 2])
def test_bad_flag_and_killed_group_report_alike(tiny, tmp_path, nproc):
    def both(args: list[str], **kwargs) -> list:
        return [run_pretrain(args, nproc=nproc, launcher=launcher, expect_success=False,
                             **kwargs) for launcher in ("fork", "user")]

    for bad in both([*tiny, "--num-attention-heads", "3"]):
        assert bad.returncode == (2 if nproc == 1 else 1), bad.returncode
        assert "pretrain_gpt.py: error: --hidden-size (64) must be divisible" in bad.stderr
    for launcher, killed in zip(("fork", "user"), both(
            [*tiny, "--train-iters", "3", "--save-interval", "1"],
            save_dir=tmp_path / "killed", env={FAULT_ENV: "save:after_commit@1"}),
            strict=True):
        # The fault kills the process group after the save: with one rank that of `python`;
        # with several, the rank's own, and the launcher reports the failed rank.
        assert killed.returncode == (-9 if nproc == 1 else 1), (launcher, killed.returncode)
        assert (tmp_path / "killed" / "latest_checkpointed_iteration.txt").read_text() == "1"
