"""--rampup-batch-size START INCREMENT SAMPLES (Megatron-LM's flag, megatron-core's calculator):
the global batch grows on schedule, the sample counter follows it, and a resumed run continues
the ramp exactly where it stopped."""

from __future__ import annotations

import re

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.data import BatchSizeSchedule
from tests.conftest import run_pretrain

RAMP = ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size", "2", "2",
        "24", "--log-interval", "1", "--eval-iters", "0"]
# From 2 to 8 in 3 increments of 2 over 24 samples: one increment per 8 consumed samples, and
# the full batch once more than 24 samples are consumed (Megatron-LM's rule).
EXPECTED_SIZES = [2, 2, 2, 2, 4, 4, 6, 6, 8, 8]
_LINE = re.compile(r"consumed samples:\s+(\d+) \|.*?global batch size:\s+(\d+) \|")


def logged_batches(stdout: str) -> list[tuple[int, int]]:
    return [(int(c), int(b)) for c, b in _LINE.findall(stdout)]


def test_schedule_is_a_function_of_consumed_samples():
    schedule = BatchSizeSchedule(8, 2, 1, (2, 2, 24))
    consumed, sizes = 0, []
    for _ in EXPECTED_SIZES:
        sizes.append(schedule.at(consumed))
        consumed += sizes[-1]
    assert sizes == EXPECTED_SIZES
    assert schedule.at(4) == 2 and schedule.at(100) == 8  # any order: no hidden state
    assert BatchSizeSchedule(8, 2, 1).at(0) == 8


def test_rampup_trains_on_schedule_and_resumes_exactly(tiny, tmp_path):
    args = [*tiny, *RAMP, "--train-iters", "10"]
    straight = run_pretrain(args, save_dir=tmp_path / "straight")
    batches = logged_batches(straight.stdout)
    assert [size for _, size in batches] == EXPECTED_SIZES
    consumed = [sum(EXPECTED_SIZES[:i + 1]) for i in range(len(EXPECTED_SIZES))]
    assert [c for c, _ in batches] == consumed

    first = run_pretrain([*args, "--exit-interval", "5"], save_dir=tmp_path / "resumed")
    second = run_pretrain([*args, "--load", str(tmp_path / "resumed")],
                          save_dir=tmp_path / "resumed")
    assert logged_batches(first.stdout) + logged_batches(second.stdout) == batches
    assert second.losses() == straight.losses()  # metrics.jsonl holds all 10, full precision


@pytest.mark.parametrize(("rampup", "message"), [
    (["3", "1", "24"], "multiples of --micro-batch-size x data-parallel size (2)"),
    (["2", "4", "24"], "must be a multiple of INCREMENT"),
    (["8", "2", "24"], "START must be in 1..7"),
    (["2", "2", "0"], "SAMPLES >= 1"),
])
def test_bad_rampup_is_one_line(rampup, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*RAMP[:4], "--rampup-batch-size", *rampup], world_size=1)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
