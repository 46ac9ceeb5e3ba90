"""Checkpoints: model and optimizer through megatron-core dist_checkpointing (torch_dist), plus the
run state and every rank's RNG, written so that a crash at any moment leaves a loadable one.

Layout (Megatron-LM's names):
    SAVE/iter_0000010/                  dist_checkpointing shards + run_state.json + rng/
    SAVE/latest_checkpointed_iteration.txt

A save goes to `iter_N.partial/`, is renamed to `iter_N/` once every rank has finished, and only
then does the tracker file move (atomically) to N.

Loading never unpickles arbitrary objects: our own files are JSON and tensor-only files read with
`weights_only=True`; megatron's `common.pt` and torch's `.distcp` shards are read weights-only by
torch; the one plain pickle, torch.distributed.checkpoint's `.metadata`, is first replayed by an
unpickler that admits only the checkpoint-metadata classes, so a tampered file is refused before
torch loads it.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint.api import CheckpointException as DcpException

from megatron_lgs import fsdp_checkpoint, model_record, optimizer_checkpoint, schedule_resume
from megatron_lgs.async_save import AsyncSaves
from megatron_lgs.lgs.sync import LgsEngine
from megatron_lgs.model import num_transformer_layers
from megatron_lgs.run_config import CheckpointConfig, ConfigError
from megatron_lgs.run_state import RunState

if TYPE_CHECKING:
    from megatron_lgs.training import Datasets

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RUN_STATE_FILE = "run_state.json"
LAYOUT_FILE = "layout.json"
# Test hook, "POINT@ITERATION": SIGKILL this process group (the launcher, every rank and their
# helper processes, like a node going down) at a named point of that iteration's save, to prove
# that a crash at that moment leaves a loadable checkpoint. Tests start the run in its own group.
FAULT_ENV = "MEGATRON_LGS_FAULT"


def _fault_point(name: str, iteration: int) -> None:
    if os.environ.get(FAULT_ENV) == f"{name}@{iteration}":
        os.killpg(os.getpgrp(), signal.SIGKILL)


def checkpoint_dir(root: str, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def latest_iteration(root: str) -> int | None:
    """The last completely written checkpoint, or None when there is none."""
    tracker = Path(root) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ConfigError(f"{tracker} does not hold an iteration number: {text!r}")
    iteration = int(text)
    if not checkpoint_dir(root, iteration).is_dir():
        raise ConfigError(f"{tracker} names iteration {iteration}, but "
                          f"{checkpoint_dir(root, iteration)} is missing")
    return iteration


def saved_iterations(root: str) -> list[int]:
    """The iterations of the complete checkpoints under `root`, in order."""
    names = (p.name for p in Path(root).glob("iter_*") if p.is_dir())
    return sorted(int(n[5:]) for n in names if n[5:].isdigit())


def iteration_to_load(cfg: CheckpointConfig) -> int | None:
    """--ckpt-step's iteration (Megatron-LM's: a run rewound to an earlier checkpoint), else the
    tracker's; None when there is no checkpoint yet."""
    assert cfg.load is not None
    if cfg.ckpt_step is None:
        return latest_iteration(cfg.load)
    saved = saved_iterations(cfg.load)
    if cfg.ckpt_step not in saved:
        raise ConfigError(f"--ckpt-step {cfg.ckpt_step}: no checkpoint of that iteration under "
                          f"--load {cfg.load}; it holds "
                          f"{', '.join(map(str, saved)) if saved else 'none'}")
    later = [i for i in saved if i > cfg.ckpt_step]
    if later and dist.get_rank() == dist.get_world_size() - 1:
        print(f" --ckpt-step {cfg.ckpt_step}: iteration(s) {', '.join(map(str, later))} under "
              f"{cfg.load} are of the run rewound from; a save of this run at the same "
              f"iteration replaces one, the others stay", flush=True)
    return cfg.ckpt_step


class _MetadataUnpickler(pickle.Unpickler):
    """Admits what torch.distributed.checkpoint writes into `.metadata`, nothing else."""

    def find_class(self, module: str, name: str) -> object:
        allowed = (
            module.startswith("torch.distributed.checkpoint.")
            or (module == "torch" and (name == "Size"
                                       or isinstance(getattr(torch, name, None), torch.dtype)))
            or (module == "torch.serialization" and name == "_get_layout")
            or (module == "collections" and name == "OrderedDict")
            or (module == "pathlib" and name in ("PosixPath", "PurePosixPath"))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata")
        return super().find_class(module, name)


def check_metadata(directory: Path) -> None:
    """Refuse a checkpoint whose pickled metadata references anything but metadata classes."""
    path = directory / ".metadata"
    try:
        with open(path, "rb") as f:
            _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise ConfigError(f"refusing to load {path}: {exc}") from None


def _rng_state() -> dict[str, object]:
    state: dict[str, object] = {
        "cpu": torch.get_rng_state(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(dict(state["tracker"]))


def _model_keys(model: list) -> list[str]:
    """Megatron-LM's keys: "model", or "model0", "model1", ... for virtual pipeline chunks."""
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _sharded_state_dict(model: list, optimizer: MegatronOptimizer | None,
                        is_loading: bool, legacy_plain: bool = False) -> dict:
    """`legacy_plain`: the optimizer state as plain optimizers saved it until 2026-12-07, in
    megatron-core's own format (it loads only into the same plain optimizer and EP split)."""
    if fsdp_checkpoint.is_fsdp(model):  # ZeRO-3: every rank's shards, in the same format
        return fsdp_checkpoint.sharded_state_dict(model, optimizer, is_loading)
    # The bare GPTModel's names: checkpoints do not depend on the DDP / Float16Module wrappers,
    # nor (sharded tensors carry global names and offsets) on the parallel layout.
    state = {key: chunk.sharded_state_dict()
             for key, chunk in zip(_model_keys(model), unwrap_model(model), strict=True)}
    if optimizer is None:
        return state
    if legacy_plain:
        state["optimizer"] = optimizer.sharded_state_dict(dict(state), is_loading=is_loading)
    else:
        state["optimizer"] = optimizer_checkpoint.sharded_state_dict(
            optimizer, dict(state), is_loading)
    return state


def _gather_deferred_weights(model: list) -> None:
    """Under --overlap-param-gather the distributed optimizer leaves each rank's weights outside
    its shard as they were before the step until the next forward gathers them, and a
    checkpoint writes a replicated weight from one rank: gather them first, as Megatron-LM does
    before saving. Until 2026-12-07 such checkpoints held the step before's weights outside rank
    0's shard (resumed without the flag, or exported, the model was another)."""
    if fsdp_checkpoint.is_fsdp(model) or not model[0].ddp_config.overlap_param_gather:
        return
    for chunk in model:
        chunk.start_param_sync(force_sync=True)


def layout(model) -> dict[str, object]:
    """The parallel layout of this run (collective: gathers each rank's bucket and layer
    counts)."""
    if fsdp_checkpoint.is_fsdp(model):
        buckets = sum(len(chunk.param_and_grad_buffer.parameter_groups) for chunk in model)
        sharding = f"megatron_fsdp:{model[0].ddp_config.data_parallel_sharding_strategy}"
    else:
        buckets = sum(len(b.buckets) for chunk in model
                      for b in chunk.buffers + chunk.expert_parallel_buffers)
        sharding = ("distributed_optimizer" if model[0].ddp_config.use_distributed_optimizer
                    else "none")
    layers = num_transformer_layers(model)
    per_rank: list[tuple[int, int]] = [(0, 0)] * dist.get_world_size()
    dist.all_gather_object(per_rank, (buckets, layers))
    ps = parallel_state
    return {
        "optimizer_format": optimizer_checkpoint.FORMAT,
        "optimizer_format_version": optimizer_checkpoint.FORMAT_VERSION,
        "world_size": dist.get_world_size(),
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "context_parallel_size": ps.get_context_parallel_world_size(),
        "data_parallel_size": ps.get_data_parallel_world_size(),
        "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
        "expert_tensor_parallel_size": ps.get_expert_tensor_parallel_world_size(),
        "optimizer_sharding": sharding,
        "grad_buckets_per_rank": [b for b, _ in per_rank],
        # The pipeline split: which layers a stage holds decides its ranks' RNG streams' use.
        "transformer_layers_per_rank": [n for _, n in per_rank],
    }


def _describe(record: dict) -> str:
    layers = record.get("transformer_layers_per_rank") or [0]
    uneven = f", {min(layers)}..{max(layers)} layers per rank" if min(layers) != max(layers) else ""
    return (f"TP{record['tensor_model_parallel_size']} x PP{record['pipeline_model_parallel_size']}"
            f"{uneven} x CP{record['context_parallel_size']} x DP{record['data_parallel_size']}, "
            f"EP{record['expert_model_parallel_size']}, optimizer sharding "
            f"{record.get('optimizer_sharding', 'unrecorded')}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(cfg: CheckpointConfig, state: RunState, model,
                    optimizer: MegatronOptimizer, scheduler: OptimizerParamScheduler,
                    lgs: LgsEngine | None = None, async_saves: AsyncSaves | None = None,
                    describe: Callable[[Path], None] | None = None) -> Path:
    """Write iteration `state.iteration`; returns its directory. Collective over all ranks.
    `describe(directory)` adds rank 0's description of the model before the commit. With
    `async_saves` it returns once the tensors are handed to the writers; the directory and the
    tracker appear when `async_saves` commits it."""
    assert cfg.save is not None
    rank = dist.get_rank()
    final = checkpoint_dir(cfg.save, state.iteration)
    partial = final.with_name(final.name + ".partial")
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save
        partial.mkdir(parents=True)
    dist.barrier()

    state.scheduler = schedule_resume.state_dict(scheduler)
    run_layout = {**layout(model), "optimizer_saved": not cfg.no_save_optim}
    _gather_deferred_weights(model)
    sharded = _sharded_state_dict(model, None if cfg.no_save_optim else optimizer,
                                  is_loading=False)
    request = dist_checkpointing.save(sharded, str(partial),
                                      async_sharded_save=async_saves is not None)
    (partial / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), partial / "rng" / f"rank_{rank:05d}.pt")
    if lgs is not None:  # INT8 error-feedback residuals: per rank, like the RNG streams
        (partial / "lgs").mkdir(exist_ok=True)
        torch.save(lgs.state_dict(), partial / "lgs" / f"rank_{rank:05d}.pt")
    # The run state as of this save, not as of its commit (training has moved on by then).
    commit = functools.partial(_commit, Path(cfg.save), partial, final, state.iteration,
                               state.to_json(), json.dumps(run_layout, indent=1), describe)
    if async_saves is not None:
        request.add_finalize_fn(commit)
        async_saves.calls.schedule_async_request(request)
        _fault_point("save:in_flight", state.iteration)
        return final
    _fault_point("save:after_shards", state.iteration)
    dist.barrier()  # every rank's files are written
    commit()
    return final


def _commit(root: Path, partial: Path, final: Path, iteration: int, run_state: str,
            run_layout: str, describe: Callable[[Path], None] | None = None) -> None:
    """Make a fully written checkpoint the one in charge (collective)."""
    if dist.get_rank() == 0:
        _write_atomic(partial / RUN_STATE_FILE, run_state)
        _write_atomic(partial / LAYOUT_FILE, run_layout)
        if describe is not None:
            describe(partial)
        if final.exists():  # the same iteration saved again (e.g. resumed, then exit-interval)
            shutil.rmtree(final)
        os.replace(partial, final)
        _write_atomic(root / TRACKER_FILE, str(iteration))
    dist.barrier()
    if dist.get_rank() == dist.get_world_size() - 1:
        print(f" saved checkpoint at iteration {iteration} to {final}", flush=True)
    _fault_point("save:after_commit", iteration)


def load_checkpoint(cfg: CheckpointConfig, state: RunState, model,
                    optimizer: MegatronOptimizer, scheduler: OptimizerParamScheduler,
                    lgs: LgsEngine | None, datasets: Datasets | None,
                    config_mismatch: Callable[[RunState], str | None]) -> bool:
    """Restore from the newest complete checkpoint under --load (or --ckpt-step's). Returns
    False when there is none yet (a fresh start). Refuses, with a clear error, a checkpoint of
    a different run, or with --finetune one whose vocabulary is not `datasets`'s.
    `config_mismatch(saved)`: why a checkpoint whose run state is `saved` is not this run's,
    or None (`run_state`)."""
    iteration = iteration_to_load(cfg)
    if iteration is None:
        return False
    directory = checkpoint_dir(cfg.load, iteration)
    saved = RunState.from_json((directory / RUN_STATE_FILE).read_text())
    if not cfg.finetune:
        legacy = datasets.legacy_fingerprint if datasets else None  # saved before 2026-12-06
        mismatch = config_mismatch(saved)
        if mismatch is None and saved.data_fingerprint not in {state.data_fingerprint, legacy}:
            mismatch = (f"its data fingerprint ({saved.data_fingerprint}) differs from this "
                        f"run's ({state.data_fingerprint}): the data settings changed")
        if mismatch:
            raise ConfigError(f"--load {directory}: {mismatch}. Use --finetune to load only "
                              f"weights")
        schedule_line = schedule_resume.check(saved.scheduler, scheduler, cfg, directory)
        # Checkpoints saved before 2026-12-07 do not record their batch size: it may not change.
        batch = saved.global_batch_size or state.global_batch_size
        if batch != state.global_batch_size and dist.get_rank() == dist.get_world_size() - 1:
            print(f" global batch size changed from {batch} to {state.global_batch_size}: the "
                  f"run continues at sample {saved.consumed_train_samples} with the new batch",
                  flush=True)
    elif datasets is not None:
        model_record.check_finetune_vocabulary(directory, datasets.tokenizer_file,
                                               datasets.vocab_size)

    check_metadata(directory)
    layout_file = directory / LAYOUT_FILE
    if not layout_file.is_file():
        raise ConfigError(f"--load {directory}: no {LAYOUT_FILE}; it was written before "
                          f"checkpoints became layout-free (optimizer in dp_reshardable "
                          f"buckets). Resume it with the version that wrote it")
    saved_layout = json.loads(layout_file.read_text())
    run_layout = layout(model)
    load_optim = not (cfg.no_load_optim or cfg.finetune)
    if load_optim and saved_layout.get("optimizer_saved") is False:
        raise ConfigError(f"--load {directory}: it was saved with --no-save-optim and holds no "
                          f"optimizer state: add --no-load-optim to load the weights and start "
                          f"the optimizer afresh")
    legacy_plain = (load_optim and saved_layout.get("optimizer_format_version", 1) == 1
                    and saved_layout.get("optimizer_sharding",
                                         run_layout["optimizer_sharding"]) == "none")
    if legacy_plain and run_layout["optimizer_sharding"] != "none":
        raise ConfigError(f"--load {directory}: its optimizer state was saved before 2026-12-07 "
                          f"by a plain optimizer, in megatron-core's format, which loads only "
                          f"into a plain optimizer, not with optimizer sharding "
                          f"{run_layout['optimizer_sharding']}: resume with the saving run's "
                          f"optimizer flags, or add --no-load-optim to load the weights and "
                          f"start the optimizer afresh")
    if legacy_plain and any(getattr(o, "init_state_fn", None) is None
                            for o in optimizer_checkpoint.inner_optimizers(optimizer)):
        raise ConfigError(f"--load {directory}: its optimizer state was saved before 2026-12-07 "
                          f"by --optimizer sgd in megatron-core's format, which megatron-core "
                          f"0.16.1 cannot load (its SGD has no init_state_fn): add "
                          f"--no-load-optim to load the weights and start the optimizer afresh")
    sharded = _sharded_state_dict(model, optimizer if load_optim else None, is_loading=True,
                                  legacy_plain=legacy_plain)
    try:
        loaded = dist_checkpointing.load(sharded, str(directory))
    except (CheckpointingException, DcpException, optimizer_checkpoint.ReshardError) as exc:
        if isinstance(exc, DcpException):  # torch's wrapper of each rank's failure
            exc = next(iter(exc.failures.values()))[0]
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"--load {directory}: saved as {_describe(saved_layout)}, cannot be "
                          f"read as {_describe(run_layout)}: {reason}") from None
    if fsdp_checkpoint.is_fsdp(model):
        fsdp_checkpoint.load_state_dict(model, optimizer, sharded, loaded, load_optim)
    else:
        _load_unsharded(model, optimizer, sharded, loaded, load_optim, legacy_plain)
    if cfg.finetune:
        return True

    schedule_resume.restore(scheduler, saved.scheduler, cfg)
    if schedule_line and dist.get_rank() == dist.get_world_size() - 1:
        print(schedule_line, flush=True)
    for name in ("iteration", "consumed_train_samples", "skipped_iterations", "nan_iterations",
                 "iterations_to_skip", "stability", "data_mix", "lgs_autotune"):
        setattr(state, name, getattr(saved, name))
    # Buckets and ZeRO stage do not decide which rank computes what: the RNG streams still fit.
    free = ("grad_buckets_per_rank", "optimizer_sharding")
    # Keys both records have: older checkpoints (and imported weights) lack the layer counts.
    keys = (saved_layout.keys() & run_layout.keys()) - set(free)
    same_layout = all(saved_layout[k] == run_layout[k] for k in keys)
    if not cfg.no_load_rng and not same_layout:
        # Each rank's RNG streams belong to its place in the saved layout (dropout masks of a
        # tensor-parallel shard, of a pipeline stage): none of them is this rank's stream.
        if dist.get_rank() == dist.get_world_size() - 1:
            print(f" layout changed from {_describe(saved_layout)} to {_describe(run_layout)}: "
                  f"weights and optimizer state resharded, RNG streams start fresh", flush=True)
    elif not cfg.no_load_rng:
        rng_file = directory / "rng" / f"rank_{dist.get_rank():05d}.pt"
        if not rng_file.is_file():
            raise ConfigError(f"{rng_file} is missing (saved with another world size?); "
                              f"use --no-load-rng to continue with fresh RNG streams")
        rng = torch.load(rng_file, weights_only=True)
        # A CUDA generator's state is saved only where there is one. The tracker's streams are
        # CUDA generators on a GPU and the CPU generator elsewhere: neither state fits the
        # other device's generator, so a checkpoint moved between them starts fresh streams.
        saved_on, here = ("cuda" if "cuda" in rng else "cpu"), \
            ("cuda" if torch.cuda.is_available() else "cpu")
        if saved_on == here:
            _set_rng_state(rng)
        elif dist.get_rank() == dist.get_world_size() - 1:
            print(f" checkpoint saved on {saved_on}, resumed on {here}: weights and optimizer "
                  f"state loaded, RNG streams start fresh", flush=True)
    lgs_file = directory / "lgs" / f"rank_{dist.get_rank():05d}.pt"
    if lgs is not None and lgs_file.is_file():
        lgs.load_state_dict(torch.load(lgs_file, weights_only=True), same_layout)
    return True


def _load_unsharded(model: list, optimizer: MegatronOptimizer, sharded: dict, loaded: dict,
                    load_optim: bool, legacy_plain: bool) -> None:
    """Megatron DDP's chunks (optionally with the distributed optimizer): what was read."""
    for key, chunk in zip(_model_keys(model), unwrap_model(model), strict=True):
        chunk.load_state_dict(loaded[key])
    if load_optim and legacy_plain:
        optimizer.load_state_dict(loaded["optimizer"])
    elif load_optim:
        optimizer_checkpoint.load_state_dict(optimizer, sharded["optimizer"], loaded["optimizer"])
