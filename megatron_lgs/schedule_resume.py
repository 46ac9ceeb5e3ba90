"""The LR and weight-decay schedule across a resume, as Megatron-LM treats it, and the
optimizer's other stateless settings with it.

A checkpoint holds megatron's scheduler state (its learning rates, warm-up and decay steps,
decay style, weight decay, and the step count), and beside it the gradient clipping and
Adam's betas and epsilon (SGD's momentum). By default a resume must ask for the same, and one
that differs is refused in one line that names what differs (Megatron-LM stops on an
assertion for the schedule, lets --clip-grad change without a word and brings the betas back
from the checkpoint without one). `--override-opt_param-scheduler` takes this run's settings
from the step the checkpoint reached: a lower learning rate or tighter clipping after a loss
spike, a longer run, a WSD cool-down branched off a checkpoint.
`--use-checkpoint-opt_param-scheduler` keeps the checkpoint's whatever the command line says.
Either way the log says what changed or what was kept. The step count and the optimizer's
moments always come from the checkpoint.

megatron-core's scheduler does the choosing (`override_opt_param_scheduler`,
`use_checkpoint_opt_param_scheduler`); this module checks first, so that its assertion never
fires, records WSD's two settings its state leaves out, sets the param groups' own rate
bounds, which megatron's get_lr prefers and the optimizer's load restores from the checkpoint
(so that Megatron-LM's override leaves the old rate), and applies the chosen weight decay to the
first resumed step, which megatron's load leaves at the command line's (it steps before it sets
the weight decay).
"""

from __future__ import annotations

from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_lgs.optimizer_checkpoint import inner_optimizers
from megatron_lgs.run_config import CheckpointConfig, ConfigError

# The scheduler state's entries a run sets, as a message names them; the weight decay's end,
# steps and style follow from --weight-decay and the decay steps (optim.build_scheduler). WSD's
# two are ours: megatron's state_dict() leaves them out; checkpoints saved before 2026-12-08
# lack them.
NAMES = {
    "max_lr": "learning rate (--lr)",
    "min_lr": "minimum learning rate (--min-lr)",
    "lr_warmup_steps": "warm-up steps (--lr-warmup-iters or --lr-warmup-fraction)",
    "lr_decay_steps": "decay steps (--lr-decay-iters, else --train-iters)",
    "lr_decay_style": "decay style (--lr-decay-style)",
    "start_wd": "weight decay (--weight-decay)",
    "wsd_decay_steps": "WSD decay steps (--lr-wsd-decay-iters)",
    "lr_wsd_decay_style": "WSD decay style (--lr-wsd-decay-style)",
}
# The stateless settings of each step, as megatron's OptimizerConfig names them (ours too),
# recorded from it since 2026-12-08: the optimizer's load brings the betas, epsilon and
# momentum back into its param groups, so `restore` sets them to the ones chosen.
STEP_NAMES = {"clip_grad": "--clip-grad", "adam_beta1": "--adam-beta1",
              "adam_beta2": "--adam-beta2", "adam_eps": "--adam-eps",
              "sgd_momentum": "--sgd-momentum"}
OVERRIDE, USE_CHECKPOINT = "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"


def state_dict(scheduler: OptimizerParamScheduler) -> dict:
    """What a checkpoint records: megatron's scheduler state, WSD's settings and the step's
    (from the optimizer's config, where the run's are in effect)."""
    config = scheduler.optimizer.config
    return {**scheduler.state_dict(), "wsd_decay_steps": scheduler.wsd_decay_steps,
            "lr_wsd_decay_style": scheduler.lr_wsd_decay_style,
            **{k: getattr(config, k) for k in STEP_NAMES}}


def changes(saved: dict, scheduler: OptimizerParamScheduler) -> list[str]:
    """'name checkpoint -> this run' for each setting this run changes."""
    now = state_dict(scheduler)
    return [f"{label} {saved[key]} -> {now[key]}"
            for key, label in {**NAMES, **STEP_NAMES}.items()
            if key in saved and saved[key] != now[key]]


def check(saved: dict, scheduler: OptimizerParamScheduler, cfg: CheckpointConfig,
          directory: object) -> str | None:
    """Refuse a changed schedule that no flag accepts; else the line the log gets, if any."""
    changed = changes(saved, scheduler)
    if not changed:
        return None
    what = ", ".join(changed)
    if cfg.override_opt_param_scheduler:
        return (f" optimizer settings from this run's flags ({OVERRIDE}), continuing at step "
                f"{saved['num_steps']}: {what} (checkpoint -> this run)")
    if cfg.use_checkpoint_opt_param_scheduler:
        return (f" optimizer settings of the checkpoint kept ({USE_CHECKPOINT}), this run's "
                f"flags ignored: {what} (checkpoint -> flags)")
    raise ConfigError(f"--load {directory}: this run's optimizer settings are not the "
                      f"checkpoint's: {what} (checkpoint -> this run). Add {OVERRIDE} to "
                      f"continue on this run's from step {saved['num_steps']}, or "
                      f"{USE_CHECKPOINT} to keep the checkpoint's")


def restore(scheduler: OptimizerParamScheduler, saved: dict, cfg: CheckpointConfig) -> None:
    """Load the saved schedule state into `scheduler` as `check` allowed, set the step's
    settings chosen, and the first resumed step's learning rate and weight decay."""
    scheduler.override_opt_param_scheduler = cfg.override_opt_param_scheduler
    scheduler.use_checkpoint_opt_param_scheduler = not cfg.override_opt_param_scheduler
    # megatron's load *advances* by the saved step count from wherever it is; from a
    # trained-on scheduler (a rollback) that would overshoot, so start it from zero.
    scheduler.num_steps = 0
    scheduler.load_state_dict(saved)
    if not cfg.override_opt_param_scheduler:
        for key in ("wsd_decay_steps", "lr_wsd_decay_style"):
            if key in saved:
                setattr(scheduler, key, saved[key])
    _set_step_settings(scheduler.optimizer, {} if cfg.override_opt_param_scheduler else saved)
    # megatron's get_lr takes each param group's own bounds over the scheduler's, and the
    # optimizer's load brought back the checkpoint's: with megatron's override alone the old
    # rate stays (Megatron-LM issue #1138, PR #1284 open). Every group here has the run's --lr
    # and --min-lr (no per-group rates), so each takes the schedule chosen.
    for group in scheduler.optimizer.param_groups:
        group["max_lr"], group["min_lr"] = scheduler.max_lr, scheduler.min_lr
    # The warm-up starts from 0 (optim.build_scheduler), or there is none.
    scheduler.init_lr = 0.0 if scheduler.lr_warmup_steps else scheduler.max_lr
    scheduler.step(0)


def _set_step_settings(optimizer: MegatronOptimizer, saved: dict) -> None:
    """Put `saved`'s step settings (the run's where it has none) into every inner optimizer's
    config, which megatron's clipping reads, and the betas, epsilon and momentum into the
    param groups, which the optimizer's load took from the checkpoint."""
    values = {k: saved.get(k, getattr(optimizer.config, k)) for k in STEP_NAMES}
    for inner in [optimizer, *inner_optimizers(optimizer)]:
        for key, value in values.items():
            setattr(inner.config, key, value)
    for group in optimizer.param_groups:
        if "betas" in group:
            group["betas"] = (values["adam_beta1"], values["adam_beta2"])
        if "eps" in group:
            group["eps"] = values["adam_eps"]
        if "momentum" in group:
            group["momentum"] = values["sgd_momentum"]
