"""The LR and weight-decay schedule across a resume, as Megatron-LM treats it.

A checkpoint holds megatron's scheduler state (its learning rates, warm-up and decay steps,
decay style, weight decay, and the step count). By default a resume must ask for the same
schedule, and one that differs is refused in one line that names what differs (Megatron-LM
stops on an assertion there). `--override-opt_param-scheduler` takes this run's schedule from
the step the checkpoint reached: a lower learning rate after a loss spike, a longer run, a
WSD cool-down branched off a checkpoint. `--use-checkpoint-opt_param-scheduler` keeps the
checkpoint's whatever the command line says. Either way the log says what changed or what was
kept. The step count and the optimizer's moments always come from the checkpoint.

megatron-core's scheduler does the choosing (`override_opt_param_scheduler`,
`use_checkpoint_opt_param_scheduler`); this module checks first, so that its assertion never
fires, records WSD's two settings its state leaves out, sets the param groups' own rate
bounds, which megatron's get_lr prefers and the optimizer's load restores from the checkpoint
(so that Megatron-LM's override leaves the old rate), and applies the chosen weight decay to the
first resumed step, which megatron's load leaves at the command line's (it steps before it sets
the weight decay).
"""

from __future__ import annotations

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_lgs.run_config import CheckpointConfig, ConfigError

# The optimizer settings that make up the schedule: the fingerprint leaves them out
# (`run_state`), this module checks them, as megatron's scheduler state.
SCHEDULE_FIELDS = ("lr", "min_lr", "lr_decay_style", "lr_decay_iters", "lr_warmup_iters",
                   "lr_warmup_fraction", "lr_wsd_decay_style", "lr_wsd_decay_iters",
                   "weight_decay")
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
OVERRIDE, USE_CHECKPOINT = "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"


def state_dict(scheduler: OptimizerParamScheduler) -> dict:
    """What a checkpoint records of the schedule: megatron's state and WSD's settings."""
    return {**scheduler.state_dict(), "wsd_decay_steps": scheduler.wsd_decay_steps,
            "lr_wsd_decay_style": scheduler.lr_wsd_decay_style}


def changes(saved: dict, scheduler: OptimizerParamScheduler) -> list[str]:
    """'name checkpoint -> this run' for each setting the run's schedule changes."""
    now = state_dict(scheduler)
    return [f"{label} {saved[key]} -> {now[key]}" for key, label in NAMES.items()
            if key in saved and saved[key] != now[key]]


def check(saved: dict, scheduler: OptimizerParamScheduler, cfg: CheckpointConfig,
          directory: object) -> str | None:
    """Refuse a changed schedule that no flag accepts; else the line the log gets, if any."""
    changed = changes(saved, scheduler)
    if not changed:
        return None
    what = ", ".join(changed)
    if cfg.override_opt_param_scheduler:
        return (f" LR schedule from this run's flags ({OVERRIDE}), continuing at step "
                f"{saved['num_steps']}: {what} (checkpoint -> this run)")
    if cfg.use_checkpoint_opt_param_scheduler:
        return (f" LR schedule of the checkpoint kept ({USE_CHECKPOINT}), this run's flags "
                f"ignored: {what} (checkpoint -> flags)")
    raise ConfigError(f"--load {directory}: this run's LR schedule is not the checkpoint's: "
                      f"{what} (checkpoint -> this run). Add {OVERRIDE} to continue on this "
                      f"run's from step {saved['num_steps']}, or {USE_CHECKPOINT} to keep the "
                      f"checkpoint's")


def restore(scheduler: OptimizerParamScheduler, saved: dict, cfg: CheckpointConfig) -> None:
    """Load the saved schedule state into `scheduler` as `check` allowed, and set the first
    resumed step's learning rate and weight decay from it."""
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
    # megatron's get_lr takes each param group's own bounds over the scheduler's, and the
    # optimizer's load brought back the checkpoint's: with megatron's override alone the old
    # rate stays (Megatron-LM issue #1138, PR #1284 open). Every group here has the run's --lr
    # and --min-lr (no per-group rates), so each takes the schedule chosen.
    for group in scheduler.optimizer.param_groups:
        group["max_lr"], group["min_lr"] = scheduler.max_lr, scheduler.min_lr
    # The warm-up starts from 0 (optim.build_scheduler), or there is none.
    scheduler.init_lr = 0.0 if scheduler.lr_warmup_steps else scheduler.max_lr
    scheduler.step(0)
