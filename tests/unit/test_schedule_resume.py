"""The optimizer's settings across a resume (schedule_resume): the same LR schedule, clipping
and betas resume, changed ones are refused in one line naming what changed, and Megatron-LM's
two flags take this run's or keep the checkpoint's; the config fingerprint leaves them to this
check and a refused resume names the settings that differ (run_state)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from megatron_lgs import schedule_resume
from megatron_lgs.arguments import parse_args
from megatron_lgs.optim import build_scheduler
from megatron_lgs.run_config import ConfigError
from megatron_lgs.run_state import (
    RunState,
    config_fingerprint,
    config_fingerprints,
    config_mismatch,
    config_settings,
    legacy_config_fingerprint,
)

BASE = ["--train-iters", "100", "--lr", "2e-3", "--min-lr", "2e-4", "--weight-decay", "0.1",
        "--lr-warmup-iters", "10"]


class _Optimizer:
    """What megatron-core's Adam has of these settings: param groups each with its own rate
    bounds (which megatron's scheduler prefers to its own), betas and epsilon, and the config
    its clipping reads."""

    def __init__(self, o) -> None:
        self.config = SimpleNamespace(clip_grad=o.clip_grad, adam_beta1=o.adam_beta1,
                                      adam_beta2=o.adam_beta2, adam_eps=o.adam_eps,
                                      sgd_momentum=o.sgd_momentum)
        self.param_groups = [{"params": [], "lr": 0.0, "weight_decay": 0.0, "max_lr": o.lr,
                              "min_lr": o.min_lr, "betas": (o.adam_beta1, o.adam_beta2),
                              "eps": o.adam_eps} for _ in range(2)]

    def load(self, saved: dict) -> None:
        """What loading a checkpoint's param groups does."""
        for group in self.param_groups:
            group["max_lr"], group["min_lr"] = saved["max_lr"], saved["min_lr"]
            group["betas"] = (saved["adam_beta1"], saved["adam_beta2"])
            group["eps"] = saved["adam_eps"]


def _scheduler(argv: list[str], steps: int = 0):
    cfg = parse_args([*BASE, *argv], world_size=1)
    opt = _Optimizer(cfg.optim)
    scheduler = build_scheduler(cfg, opt)
    scheduler.step(increment=steps)
    return cfg, opt, scheduler


def _saved(argv: list[str] = (), steps: int = 40) -> dict:
    """The schedule a checkpoint records after `steps` steps, through JSON as run_state.json."""
    _, _, scheduler = _scheduler(list(argv), steps)
    return json.loads(json.dumps(schedule_resume.state_dict(scheduler)))


def test_the_same_schedule_resumes_where_it_stopped():
    cfg, opt, scheduler = _scheduler([])
    assert schedule_resume.check(_saved(), scheduler, cfg.checkpoint, "ckpt") is None
    opt.load(_saved())
    schedule_resume.restore(scheduler, _saved(), cfg.checkpoint)
    _, straight, _ = _scheduler([], 40)
    assert scheduler.num_steps == 40 and opt.param_groups == straight.param_groups


def test_a_changed_schedule_is_refused_naming_what_changed_and_both_flags():
    cfg, _, scheduler = _scheduler(["--lr", "1e-3", "--train-iters", "200"])
    with pytest.raises(ConfigError) as err:
        schedule_resume.check(_saved(), scheduler, cfg.checkpoint, "ckpt")
    message = str(err.value)
    assert "learning rate (--lr) 0.002 -> 0.001" in message
    assert "decay steps (--lr-decay-iters, else --train-iters) 100 -> 200" in message
    assert "--override-opt_param-scheduler" in message
    assert "--use-checkpoint-opt_param-scheduler" in message
    assert "\n" not in message and "weight decay" not in message


def test_override_continues_this_runs_schedule_from_the_saved_step():
    """A lower LR and a longer decay from step 40 on: the LR and weight decay of a fresh run of
    the new schedule at step 40, though the optimizer's load brought back the old rate's
    bounds (which left Megatron-LM's override at the old rate, its issue #1138)."""
    new = ["--lr", "1e-3", "--train-iters", "200", "--weight-decay", "0.05",
           "--override-opt-param-scheduler"]
    cfg, opt, scheduler = _scheduler(new)
    line = schedule_resume.check(_saved(), scheduler, cfg.checkpoint, "ckpt")
    assert line.startswith(" optimizer settings from this run's flags") and "step 40" in line
    assert "weight decay (--weight-decay) 0.1 -> 0.05" in line
    opt.load(_saved())
    schedule_resume.restore(scheduler, _saved(), cfg.checkpoint)
    _, fresh, _ = _scheduler(new, 40)
    assert scheduler.num_steps == 40 and opt.param_groups == fresh.param_groups
    assert opt.param_groups[0]["lr"] < 1e-3


def test_use_checkpoint_keeps_the_saved_schedule_weight_decay_and_wsd_included():
    """megatron's load steps before it sets the weight decay, so the first resumed step had the
    flags' weight decay; WSD's settings are not in megatron's state at all."""
    wsd = ["--lr-decay-style", "WSD", "--lr-wsd-decay-style", "linear"]
    saved = _saved([*wsd, "--lr-wsd-decay-iters", "20"], steps=85)
    cfg, opt, scheduler = _scheduler([*wsd, "--lr-wsd-decay-iters", "50", "--weight-decay",
                                      "0.3", "--lr", "1e-3",
                                      "--use-checkpoint-opt_param-scheduler"])
    line = schedule_resume.check(saved, scheduler, cfg.checkpoint, "ckpt")
    assert "kept" in line and "WSD decay steps (--lr-wsd-decay-iters) 20 -> 50" in line
    opt.load(saved)
    schedule_resume.restore(scheduler, saved, cfg.checkpoint)
    _, straight, _ = _scheduler([*wsd, "--lr-wsd-decay-iters", "20"], 85)
    assert opt.param_groups == straight.param_groups
    assert opt.param_groups[0]["weight_decay"] == 0.1


def test_both_flags_are_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"],
                   world_size=1)
    assert "give one" in capsys.readouterr().err


def test_the_fingerprint_leaves_these_settings_to_the_check_and_earlier_ones_still_match():
    cfg = parse_args(BASE, world_size=1)
    other = parse_args([*BASE, "--lr", "1e-3", "--lr-decay-style", "linear", "--clip-grad",
                        "0.5", "--adam-beta2", "0.99"], world_size=1)
    assert config_fingerprint(cfg) == config_fingerprint(other)
    assert config_fingerprint(cfg) != config_fingerprint(parse_args([*BASE, "--seed", "7"],
                                                                    world_size=1))
    # What a checkpoint of this config carried on 2026-12-07 (the schedule hashed in),
    # computed by that day's code, and before it.
    dec07 = parse_args(["--lr", "1e-3", "--weight-decay", "0.1", "--lr-warmup-iters", "10"],
                       world_size=1)
    accepted = config_fingerprints(dec07, dec07.training.global_batch_size)
    assert "61691cab1ec0566c" in accepted and legacy_config_fingerprint(dec07) in accepted
    # A checkpoint of then, at the default clipping, matches today's hash too, which leaves the
    # clipping out; it records no clipping beside its schedule, so it may not change unseen.
    default = parse_args([], world_size=1)
    then = RunState(config_fingerprint=config_fingerprint(default))
    assert config_mismatch(default, then) is None
    assert "its config fingerprint" in config_mismatch(parse_args(["--clip-grad", "0.5"],
                                                                  world_size=1), then)


def test_a_refused_resume_names_the_settings_that_differ():
    saved_cfg = parse_args(BASE, world_size=1)
    saved = RunState(config_fingerprint=config_fingerprint(saved_cfg),
                     config=json.loads(json.dumps(config_settings(saved_cfg))),
                     global_batch_size=saved_cfg.training.global_batch_size)
    assert config_mismatch(saved_cfg, saved) is None
    run = parse_args([*BASE, "--num-layers", "3", "--seed", "7", "--lr", "1e-3"],
                     world_size=1)
    message = config_mismatch(run, saved)
    assert message == ("it was saved with other settings: --num-layers 4 -> 3, "
                       "--seed 1234 -> 7 (checkpoint -> this run)")
    legacy = RunState(config_fingerprint=saved.config_fingerprint)  # no settings recorded
    assert "its config fingerprint" in config_mismatch(run, legacy)


def test_clipping_and_betas_change_with_the_schedule_and_are_set_where_megatron_reads_them():
    """Tighter clipping and another beta2 after a spike: refused unasked; with the override in
    the config megatron's clipping reads and in the param groups the optimizer's load refilled
    with the checkpoint's; kept with --use-checkpoint-opt_param-scheduler."""
    tighter = ["--clip-grad", "0.3", "--adam-beta2", "0.99", "--adam-eps", "1e-6"]
    cfg, _, scheduler = _scheduler(tighter)
    with pytest.raises(ConfigError, match=r"--clip-grad 1.0 -> 0.3, --adam-beta2 0.95 -> 0.99, "
                                          r"--adam-eps 1e-08 -> 1e-06 \(checkpoint"):
        schedule_resume.check(_saved(), scheduler, cfg.checkpoint, "ckpt")
    for flag, (clip, beta2, eps) in (("--override-opt_param-scheduler", (0.3, 0.99, 1e-6)),
                                     ("--use-checkpoint-opt_param-scheduler", (1.0, 0.95, 1e-8))):
        cfg, opt, scheduler = _scheduler([*tighter, flag])
        assert schedule_resume.check(_saved(), scheduler, cfg.checkpoint, "ckpt")
        opt.load(_saved())
        schedule_resume.restore(scheduler, _saved(), cfg.checkpoint)
        assert opt.config.clip_grad == clip and opt.config.adam_beta2 == beta2
        assert all(g["betas"] == (0.9, beta2) and g["eps"] == eps for g in opt.param_groups)


def test_a_wsd_cool_down_branches_off_the_constant_phase():
    """A WSD run stopped at step 40 of 100 while constant, branched to end at 60 with a decay
    over its last 10 steps: the branch's rates are those of a fresh run of the branch's
    schedule, decaying over 51-60 to the minimum."""
    wsd = ["--lr-decay-style", "WSD", "--lr-wsd-decay-style", "linear"]
    saved = _saved([*wsd, "--lr-wsd-decay-iters", "20"], steps=40)
    branch = [*wsd, "--train-iters", "60", "--lr-wsd-decay-iters", "10",
              "--override-opt_param-scheduler"]
    cfg, opt, scheduler = _scheduler(branch)
    assert "WSD decay steps (--lr-wsd-decay-iters) 20 -> 10" in schedule_resume.check(
        saved, scheduler, cfg.checkpoint, "ckpt")
    opt.load(saved)
    schedule_resume.restore(scheduler, saved, cfg.checkpoint)
    _, fresh, fresh_scheduler = _scheduler(branch, 40)
    rates = []
    for _ in range(20):
        scheduler.step(1)
        fresh_scheduler.step(1)
        assert opt.param_groups == fresh.param_groups
        rates.append(opt.param_groups[0]["lr"])
    assert rates[9] == 2e-3 and rates[10] < 2e-3 and rates[-1] == 2e-4
