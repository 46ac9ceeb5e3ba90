"""Checks of one flag's value that its type cannot make: ranges (a probability in [0, 1), a
positive scale), the weights of a --data-path blend, and output folders and files the run
must be able to write. `validation.validate` calls them with the rules that need several flags.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path

from data_pipeline.loader import parse_data_path
from megatron_lgs.run_config import Config, ConfigError


def check_ranges(cfg: Config) -> None:
    """Values no flag means: torch or megatron-core fails on most of them after start-up, with
    a traceback from deep inside (dropout, Adam's betas, weight decay, a negative std or
    --min-lr); others pass silently (megatron-core clips only when --clip-grad > 0, so -1
    trained without clipping)."""
    m, o, pr = cfg.model, cfg.optim, cfg.precision
    rules = (
        ("--hidden-dropout", m.hidden_dropout, 0 <= m.hidden_dropout < 1, "in [0, 1)"),
        ("--attention-dropout", m.attention_dropout, 0 <= m.attention_dropout < 1, "in [0, 1)"),
        ("--init-method-std", m.init_method_std, m.init_method_std > 0, "positive"),
        ("--moe-aux-loss-coeff", m.moe_aux_loss_coeff, m.moe_aux_loss_coeff >= 0,
         "non-negative"),
        ("--moe-z-loss-coeff", m.moe_z_loss_coeff,
         m.moe_z_loss_coeff is None or m.moe_z_loss_coeff >= 0, "non-negative"),
        ("--moe-expert-capacity-factor", m.moe_expert_capacity_factor,
         m.moe_expert_capacity_factor is None or m.moe_expert_capacity_factor > 0, "positive"),
        ("--min-lr", o.min_lr, o.min_lr >= 0, "non-negative"),
        ("--weight-decay", o.weight_decay, o.weight_decay >= 0, "non-negative"),
        ("--clip-grad", o.clip_grad, o.clip_grad >= 0, "non-negative (0: no clipping)"),
        ("--adam-beta1", o.adam_beta1, 0 <= o.adam_beta1 < 1, "in [0, 1)"),
        ("--adam-beta2", o.adam_beta2, 0 <= o.adam_beta2 < 1, "in [0, 1)"),
        ("--adam-eps", o.adam_eps, o.adam_eps > 0, "positive"),
        ("--sgd-momentum", o.sgd_momentum, o.sgd_momentum >= 0, "non-negative"),
        ("--optimizer-offload-fraction", o.optimizer_offload_fraction,
         0 <= o.optimizer_offload_fraction <= 1, "in [0, 1]"),
        ("--loss-scale", pr.loss_scale, pr.loss_scale is None or pr.loss_scale > 0,
         "positive"),
        ("--initial-loss-scale", pr.initial_loss_scale, pr.initial_loss_scale > 0, "positive"),
        ("--min-loss-scale", pr.min_loss_scale, pr.min_loss_scale > 0, "positive"),
    )
    for flag, value, ok, want in rules:
        if not ok:
            raise ConfigError(f"{flag} must be {want}, got {value}")


def check_output_dirs(cfg: Config) -> None:
    """A folder the run writes into must be one, or creatable: found here, not as a traceback
    from the first write. Side-effect free: nothing is created."""
    for flag, path in (("--save", cfg.checkpoint.save),
                       ("--tensorboard-dir", cfg.logging.tensorboard_dir),
                       ("--wandb-save-dir", cfg.logging.wandb_save_dir),
                       ("--data-cache-dir",
                        None if cfg.data.data_path else cfg.data.data_cache_dir),
                       ("--lgs-trace-dir", cfg.lgs.lgs_trace_dir)):
        if not path:
            continue
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"{flag} {path}: exists and is not a directory")
        problem = unwritable_parent(path)
        if problem:
            raise ConfigError(f"{flag} {path}: {problem}")


def unwritable_parent(path: str | os.PathLike[str]) -> str | None:
    """Why a folder at `path` could not be made by this process, judged on its nearest
    existing ancestor (nothing is created), or None."""
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def unwritable_file(path: str | os.PathLike[str]) -> str | None:
    """Why this process could not write a file at `path` (a folder there, a missing or
    read-only folder, a file the kernel will not open for writing), or None: asked before
    the work whose result it would hold. Opening it is the test; a file made for it is removed
    and an existing one left as it was."""
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return e.strerror
    if not existed:
        os.unlink(path)
    return None


def output_file(text: str) -> Path:
    """argparse type of a file a command writes when its work is done: refused at parse time
    (`unwritable_file`), not after the work."""
    why = unwritable_file(text)
    if why:
        raise argparse.ArgumentTypeError(f"{text}: {why}")
    return Path(text)


def check_blend_weights(domain_weights: Sequence[tuple[str, float]],
                        data_path: Sequence[str]) -> None:
    """The weights of a blend, --domain-weights or --data-path W1 DIR1 W2 DIR2 ..., here, not
    after the process groups start: finite, non-negative, not all zero."""
    if domain_weights:
        flag, weights = "--domain-weights", [w for _, w in domain_weights]
    elif len(data_path) > 1:
        try:
            flag, weights = "--data-path", [w for w, _ in parse_data_path(data_path)]
        except ValueError as e:
            raise ConfigError(str(e)) from None
    else:
        return
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"the {flag} weights must be finite, non-negative and not all zero, "
                          f"got {weights}")
