"""The cross-cutting state of a run: what the loop advances and what a checkpoint restores."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from megatron_lgs.run_config import Config, ModelConfig, OptimizerConfig


@dataclass
class RunState:
    iteration: int = 0
    consumed_train_samples: int = 0
    skipped_iterations: int = 0
    nan_iterations: int = 0
    # Iterations whose batches are consumed without an update: --iterations-to-skip plus those
    # a rollback added.
    iterations_to_skip: list[int] = field(default_factory=list)
    config_fingerprint: str = ""
    data_fingerprint: str = ""
    scheduler: dict = field(default_factory=dict)
    stability: dict = field(default_factory=dict)
    data_mix: dict = field(default_factory=dict)  # every window's domain weights so far
    lgs_autotune: dict = field(default_factory=dict)  # rank 0's threshold search (--lgs-autotune)
    # The run's --global-batch-size (the ramp-up's target); 0 in checkpoints saved before
    # 2026-12-07. A resume may change it (`config_fingerprints`), not restored.
    global_batch_size: int = 0
    # `config_settings` of the saving run; empty in checkpoints saved before 2026-12-08.
    config: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunState:
        return cls(**json.loads(text))


# The ZeRO stage is where the optimizer state lives, not what it computes: checkpoints reshard
# between stages. Their defaults stand in, so a run that kept them has the fingerprint it
# always had.
_ZERO_DEFAULTS = {name: getattr(OptimizerConfig(), name) for name in (
    "use_distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy")}
# Model flags added after runs were saved: at their default they are left out, so a run saved
# before keeps its fingerprint.
_ADDED_MODEL_DEFAULTS = {"openai_gelu": False}
# How a step is scheduled, not what it computes: recompute reruns the forward to the same bits,
# the dispatchers and the EP all-to-all overlap move the same tokens in another order, as a
# layout change does. Their defaults stand in, as for the ZeRO stage, so a resume may change
# them (a run moved to fewer GPUs turns recompute on). Since 2026-12-07; checkpoints saved
# before carry `legacy_config_fingerprint`.
_SCHEDULE_DEFAULTS = {name: getattr(ModelConfig(), name) for name in (
    "recompute_granularity", "recompute_method", "recompute_num_layers",
    "moe_token_dispatcher_type", "overlap_moe_expert_parallel_comm")}


# The LR and weight-decay schedule, clipping and Adam's betas and epsilon: a resume checks them
# against the checkpoint's record (`schedule_resume`), as Megatron-LM checks the schedule, and
# may change them with --override-opt_param-scheduler. Their defaults stand in, so a run on the
# defaults has the fingerprint it always had. Since 2026-12-08. --lr-decay-iters was never
# hashed.
_CHECKED_DEFAULTS = {name: getattr(OptimizerConfig(), name) for name in (
    "lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "lr_warmup_fraction",
    "lr_wsd_decay_style", "lr_wsd_decay_iters", "weight_decay", "clip_grad", "adam_beta1",
    "adam_beta2", "adam_eps", "sgd_momentum")}


def config_fingerprint(cfg: Config) -> str:
    """Hash of the settings that decide the numbers a step produces. A resume that changes
    them is refused unless it loads weights only (--finetune). The LR schedule, clipping and
    Adam's betas and epsilon are checked on their own (`schedule_resume`); run length, logging
    and checkpoint paths are free to change."""
    return _hash(fingerprinted(cfg))


def config_settings(cfg: Config) -> dict:
    """The settings `config_fingerprint` hashes, as a checkpoint records them (JSON values), so
    that a refused resume can say which differ."""
    return json.loads(json.dumps(fingerprinted(cfg), sort_keys=True, default=asdict))


def config_fingerprints(cfg: Config, global_batch_size: int) -> tuple[str, str, str]:
    """The config fingerprints a checkpoint of this run saved at `global_batch_size` may carry,
    in this order: today's, and those of checkpoints saved before 2026-12-08 (the LR schedule,
    clipping and betas hashed in) and 2026-12-07 (the step's schedule too). The batch size is
    hashed, so a resume that changes only it matches the saving run's fingerprint at the saved
    batch size: the run continues at its consumed-sample count with the new batch, as in
    Megatron-LM (every sample is a function of its global index, the LR schedule runs per
    step)."""
    settings = fingerprinted(_at_batch(cfg, global_batch_size))
    before_dec08 = _with(settings, "optim", _CHECKED_DEFAULTS, cfg.optim)
    before_dec07 = _with(before_dec08, "model", _SCHEDULE_DEFAULTS, cfg.model)
    return _hash(settings), _hash(before_dec08), _hash(before_dec07)


def config_mismatch(cfg: Config, saved: RunState) -> str | None:
    """Why the checkpoint whose run state is `saved` is not one of this run's; None if it is."""
    batch = saved.global_batch_size or cfg.training.global_batch_size
    today, *before = config_fingerprints(cfg, batch)
    # A checkpoint that records no settings was saved before 2026-12-08, with its clipping and
    # betas in its hash and not beside its schedule: today's hash, which leaves them out, would
    # let them change unseen.
    if saved.config_fingerprint in (before if not saved.config else [today, *before]):
        return None
    at = _at_batch(cfg, batch)
    changed = _differences(saved.config, config_settings(at)) if saved.config else []
    if changed:
        return f"it was saved with other settings: {', '.join(changed)} (checkpoint -> this run)"
    return (f"its config fingerprint ({saved.config_fingerprint}) differs from this run's "
            f"({config_fingerprint(at)}); the model, optimizer, seed or data settings changed "
            f"(or the batch size, which checkpoints saved before 2026-12-07 do not record)")


def legacy_config_fingerprint(cfg: Config) -> str:
    """What checkpoints saved before 2026-12-07 carry: both schedules' settings hashed too."""
    settings = _with(fingerprinted(cfg), "optim", _CHECKED_DEFAULTS, cfg.optim)
    return _hash(_with(settings, "model", _SCHEDULE_DEFAULTS, cfg.model))


def _at_batch(cfg: Config, global_batch_size: int) -> Config:
    return replace(cfg, training=replace(cfg.training, global_batch_size=global_batch_size))


def _with(settings: dict, part: str, names: dict, values: object) -> dict:
    """`settings` with `part`'s `names` at their `values` instead of their defaults."""
    return {**settings, part: {**settings[part],
                               **{k: getattr(values, k) for k in names}}}


def _differences(saved: dict, now: dict) -> list[str]:
    """'--flag saved -> now' for each leaf setting that differs."""
    out = []
    for key in sorted(saved.keys() | now.keys()):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b)
        elif a != b:
            out.append(f"--{key.replace('_', '-')} {a} -> {b}")
    return out


def _hash(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, default=lambda o: asdict(o))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprinted(cfg: Config) -> dict:
    """The settings `config_fingerprint` hashes."""
    return {
        "model": {**{k: v for k, v in asdict(cfg.model).items()
                     if k not in _ADDED_MODEL_DEFAULTS or v != _ADDED_MODEL_DEFAULTS[k]},
                  **_SCHEDULE_DEFAULTS},
        "precision": cfg.precision,
        "optim": {**{k: v for k, v in asdict(cfg.optim).items()
                     if k not in ("lr_decay_iters", "overlap_grad_reduce", "overlap_param_gather",
                                  "ddp_bucket_size")}, **_ZERO_DEFAULTS, **_CHECKED_DEFAULTS},
        "seed": cfg.training.seed,
        "global_batch_size": cfg.training.global_batch_size,
        "vocab_size": cfg.data.vocab_size,
    }
