"""Learning-rate schedules come from megatron-core's OptimizerParamScheduler, driven by our
flags: warmup, then constant / linear / cosine / WSD."""

from __future__ import annotations

import math

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.optim import build_scheduler


class _Optimizer:
    def __init__(self) -> None:
        self.param_groups = [{"params": [], "lr": 0.0, "weight_decay": 0.0}]


def _lrs(argv: list[str], iters: int) -> list[float]:
    cfg = parse_args(argv + ["--train-iters", str(iters)], world_size=1)
    opt = _Optimizer()
    scheduler = build_scheduler(cfg, opt)
    lrs = []
    for _ in range(iters):
        scheduler.step(increment=1)
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_warmup_is_linear_then_cosine_reaches_min_lr():
    lrs = _lrs(["--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "10"], 100)
    assert lrs[4] == pytest.approx(0.5e-3)
    assert lrs[9] == pytest.approx(1e-3)
    midpoint = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * 45 / 90))
    assert lrs[54] == pytest.approx(midpoint)
    assert lrs[-1] == pytest.approx(1e-4)


def test_constant_and_linear():
    assert set(_lrs(["--lr", "1e-3", "--lr-decay-style", "constant"], 20)) == {1e-3}
    lrs = _lrs(["--lr", "1e-3", "--min-lr", "0", "--lr-decay-style", "linear"], 20)
    assert lrs[9] == pytest.approx(1e-3 * 10 / 20)
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))


def test_wsd_holds_then_decays_over_the_last_iterations():
    lrs = _lrs(["--lr", "1e-3", "--min-lr", "1e-5", "--lr-decay-style", "WSD",
                "--lr-wsd-decay-iters", "20", "--lr-wsd-decay-style", "linear",
                "--lr-warmup-iters", "5"], 100)
    assert lrs[4] == pytest.approx(1e-3)
    assert set(lrs[5:80]) == {1e-3}
    assert lrs[89] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 10 / 20)
    assert lrs[-1] == pytest.approx(1e-5)


@pytest.mark.parametrize("argv,message", [
    (["--lr-decay-style", "cosine", "--lr-wsd-decay-iters", "20"], "with cosine they would do"),
    (["--lr-decay-style", "linear", "--lr-wsd-decay-style", "linear"], "with linear they would"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "0"], "must be in 1..95"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "-3"], "must be in 1..95"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "96"], "must be in 1..95"),
])
def test_wsd_flags_that_would_do_nothing_or_break_the_schedule_are_one_line(argv, message,
                                                                            capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--train-iters", "100", "--lr-warmup-iters", "5", *argv], world_size=1)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    parse_args(["--train-iters", "100", "--lr-warmup-iters", "5", "--lr-decay-style", "WSD",
                "--lr-wsd-decay-iters", "95"], world_size=1)
