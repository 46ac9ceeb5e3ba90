"""Our checkpoints in one CPU process: the full model of a checkpoint saved in any layout, and a
weights-only checkpoint written from full tensors.

A checkpoint stores every tensor under its global name (dist_checkpointing), so building the
model at TP = PP = EP = 1 and loading into it is megatron's own resharding path: each full tensor
is read from the boxes that the saving ranks wrote. Only the vocabulary padding depends on the
saving layout (a multiple of make_vocab_size_divisible_by x TP), so the one-process model is
padded as the saving run was.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from megatron_lgs import checkpointing, model_record
from megatron_lgs.convert.errors import ConvertError
from megatron_lgs.model import build_model
from megatron_lgs.model_record import ModelRecord
from megatron_lgs.platform import get_platform
from megatron_lgs.run_config import Config, ConfigError, PrecisionConfig
from megatron_lgs.run_state import RunState
from megatron_lgs.vocab_padding import padded_vocab_size


@contextmanager
def into_place(out: Path) -> Iterator[Path]:
    """Yield OUT.partial to write into; rename it to `out` (absent or empty) only when the
    block completes, and leave nothing behind when it does not."""
    partial = out.with_name(out.name + ".partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConvertError(f"{out}: cannot create {out.parent}: {e.strerror}") from None
    shutil.rmtree(partial, ignore_errors=True)
    try:
        yield partial
        if out.exists():
            out.rmdir()  # empty: the caller checked
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@contextmanager
def single_process(seed: int = 1234) -> Iterator[None]:
    """A world of one process (gloo, in-memory store) with megatron's groups all of size 1;
    inside an enclosing one (a test's, a tool calling another) it is that one."""
    if parallel_state.model_parallel_is_initialized():
        yield
        return
    owns_world = not dist.is_initialized()
    if owns_world:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        raise ConvertError("conversion runs in one process, not under a launcher with "
                           f"{dist.get_world_size()} ranks")
    parallel_state.initialize_model_parallel()
    # megatron's attention forks its model-parallel RNG stream (dropout) even when it is 0.
    model_parallel_cuda_manual_seed(seed)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if owns_world:
            dist.destroy_process_group()


def resolve(path: str | os.PathLike[str]) -> Path:
    """The iteration directory of CHECKPOINT: a --save directory (its latest iteration) or one
    iter_N directory. Anything else is refused in one line."""
    root = Path(path)
    if not root.is_dir():
        raise ConvertError(f"{root}: no such checkpoint directory")
    directory = root
    if (root / checkpointing.TRACKER_FILE).is_file():
        try:
            iteration = checkpointing.latest_iteration(str(root))
        except ConfigError as exc:
            raise ConvertError(str(exc)) from None
        directory = checkpointing.checkpoint_dir(str(root), iteration)
    if not (directory / checkpointing.RUN_STATE_FILE).is_file() or \
            not (directory / ".metadata").is_file():
        raise ConvertError(f"{root} is not a megatron-lgs checkpoint (no "
                           f"{checkpointing.TRACKER_FILE}, or no {checkpointing.RUN_STATE_FILE} "
                           f"and dist_checkpointing metadata)")
    if not (directory / model_record.MODEL_FILE).is_file():
        raise ConvertError(f"{directory} has no {model_record.MODEL_FILE}: it was written before "
                           f"checkpoints described their model; resume it once and save again")
    return directory


def read_record(directory: Path) -> ModelRecord:
    try:
        return model_record.read(directory)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConvertError(f"{directory / model_record.MODEL_FILE}: {exc}") from None


def _one_process_config(record: ModelRecord) -> Config:
    m = record.model
    model = replace(
        m, transformer_impl="local", moe_grouped_gemm=False, recompute_granularity=None,
        recompute_method=None, recompute_num_layers=None,
        # The saving run's padded size, at TP = 1.
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by
        * record.tensor_model_parallel_size)
    precision = PrecisionConfig(bf16=record.precision == "bf16", fp16=record.precision == "fp16")
    return Config(model=model, precision=precision)


def build_full_model(record: ModelRecord) -> torch.nn.Module:
    """The bare megatron GPTModel of the record at TP = PP = 1 (inside `single_process`)."""
    model = build_model(_one_process_config(record), get_platform(), record.vocab_size)
    return getattr(model, "module", model)  # bf16/fp16: the GPTModel inside Float16Module


def load_full_model(directory: Path, record: ModelRecord) -> torch.nn.Module:
    """Every tensor of the checkpoint in one process, whatever layout saved it."""
    try:
        checkpointing.check_metadata(directory)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    model = build_full_model(record)
    sharded = {"model": model.sharded_state_dict()}
    try:
        loaded = dist_checkpointing.load(sharded, str(directory))
    except Exception as exc:  # dist_checkpointing wraps every reader failure differently
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConvertError(f"{directory}: cannot read the model: {reason}") from None
    model.load_state_dict(loaded["model"])
    model.eval()
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """megatron's tensor names (local spec, TP = 1) -> full tensors; no extra state."""
    return {k: v.detach() for k, v in model.state_dict().items()
            if not k.endswith("_extra_state")}


def padded_vocab(record: ModelRecord) -> int:
    m = record.model
    return padded_vocab_size(record.vocab_size, m.make_vocab_size_divisible_by,
                             record.tensor_model_parallel_size)


def save_weights_checkpoint(model: torch.nn.Module, record: ModelRecord, tokenizer_file: Path,
                            out: Path) -> Path:
    """A weights-only checkpoint at iteration 0 that any layout loads with --finetune (its
    run state carries no config or data fingerprint: it belongs to no run yet)."""
    final = checkpointing.checkpoint_dir(str(out), 0)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True)
    dist_checkpointing.save({"model": model.sharded_state_dict()}, str(partial))
    layout = {"optimizer_format": None, "optimizer_saved": False, "world_size": 1,
              "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
              "context_parallel_size": 1, "data_parallel_size": 1, "expert_model_parallel_size": 1,
              "expert_tensor_parallel_size": 1, "grad_buckets_per_rank": [0]}
    (partial / checkpointing.LAYOUT_FILE).write_text(json.dumps(layout, indent=1))
    (partial / checkpointing.RUN_STATE_FILE).write_text(RunState().to_json())
    model_record.write(partial, record, str(tokenizer_file))
    os.replace(partial, final)
    (out / checkpointing.TRACKER_FILE).write_text("0")
    return final


def remove_partial(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
