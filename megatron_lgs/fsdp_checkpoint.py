"""Megatron-FSDP (ZeRO-3) checkpoints in the distributed optimizer's layout-free format.

Under `--use-megatron-fsdp` each data-parallel rank holds a contiguous flat range of every
parameter (its shard of megatron-FSDP's buckets): the model-dtype weight, the fp32 main weight
and Adam's moments. Each rank writes exactly that range, cut into boxes of the parameter's global
tensor under the keys a ZeRO-1 / unsharded run uses (`optimizer_checkpoint.slice_boxes`): the
model weight under the model's own key, the main weight and moments under
`optimizer.state.<state>.<model key>`. So a ZeRO-3 checkpoint is the same checkpoint as any other
layout's, with no gather on save: it loads into ZeRO-1 and back, and into any DP size.

megatron-core 0.16.1's own format for Megatron-FSDP, `fsdp_dtensor`, saves DTensors under
per-layer module names that no other layout reads; this one keeps one format for every layout.

How megatron saves each parameter (key, global shape and offsets, SwiGLU factories) is read from
the model's `sharded_state_dict()` *before* Megatron-FSDP wraps it (`record_mapping`): once
wrapped, the module's state-dict hooks swap in the DTensor shards, whose local shapes megatron's
`sharded_state_dict` then takes for the parameters' own. The record keeps no tensor data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import (
    ShardedBase,
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
)
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.utils import unwrap_model

from megatron_lgs.optimizer_checkpoint import (
    ReshardError,
    common_for,
    copy_boxes,
    load_common,
    slice_boxes,
)

MAPPING_ATTR = "checkpoint_mapping"
OPTIMIZER_STATES = ("exp_avg", "exp_avg_sq")


EXTRA_STATE = "_extra_state"


def record_mapping(chunk: torch.nn.Module) -> dict[str, ShardedBase]:
    """How megatron saves each parameter of `chunk`, by parameter name, without data, and each
    module's `_extra_state` object under its key. Call it before Megatron-FSDP wraps `chunk`."""
    names = {param: name for name, param in chunk.named_parameters()}
    mapping = {}
    for i, sharded in enumerate(nested_values(unwrap_model(chunk).sharded_state_dict())):
        if isinstance(sharded, ShardedTensor | ShardedTensorFactory) and sharded.data in names:
            mapping[names[sharded.data]] = replace(sharded, data=None)
        else:
            mapping[f"{EXTRA_STATE}/{i}"] = sharded
    return mapping


def _extra_states(mapping: dict[str, ShardedBase]) -> dict[str, ShardedObject]:
    """The modules' extra state, as recorded: empty for the local spec's layers. Anything else
    (Transformer Engine's FP8 scaling state) changes while training, and is refused."""
    extra = {k: v for k, v in mapping.items() if k.startswith(EXTRA_STATE)}
    for sharded in extra.values():
        if not (isinstance(sharded, ShardedObject) and sharded.key.endswith(EXTRA_STATE)
                and sharded.data is None):
            raise ReshardError(f"{sharded.key}: Megatron-FSDP checkpoints here save parameters "
                               f"and empty extra state only")
    return extra


def is_fsdp(model: list) -> bool:
    return isinstance(model[0], FullyShardedDataParallel)


@dataclass
class _Shard:
    """One parameter's part on this rank."""

    sharded: ShardedBase  # how the model saves the parameter (no data)
    shape: torch.Size  # the whole parameter's shape
    start: int  # this rank's flat range [start, end) of the parameter
    end: int
    main: torch.nn.Parameter  # the optimizer's parameter: a DTensor of the fp32 main weight
    weight: torch.Tensor  # this rank's flat range of the model-dtype weight


def _shards(wrapper: FullyShardedDataParallel) -> list[_Shard]:
    mapping = getattr(wrapper, MAPPING_ATTR, None)
    if mapping is None:
        raise ReshardError("the Megatron-FSDP model was wrapped without a checkpoint mapping "
                           "(fsdp_checkpoint.record_mapping)")
    buffer = wrapper.module.param_and_grad_buffer
    shards = []
    _extra_states(mapping)
    for name, main in buffer.optimizer_named_parameters:
        orig = main.orig_param
        group = buffer.parameter_groups[buffer.param_to_param_group[orig]]
        flat_range = getattr(main, "megatron_fsdp_slice", None)
        if flat_range is None or group.model_weight_buffer is None:
            raise ReshardError(f"{name}: Megatron-FSDP keeps no sharded main weight for it "
                               f"(strategy {buffer.ddp_config.data_parallel_sharding_strategy})")
        weight = group.model_weight_buffer.get_item(
            group.model_weight_buffer.param_idx[orig], only_shard=True)
        local = main.to_local()
        if not local.numel() == weight.numel() == flat_range.stop - flat_range.start:
            raise ReshardError(f"{name}: its main weight, model weight and slice disagree")
        shards.append(_Shard(mapping[name], orig.shape, flat_range.start, flat_range.stop, main,
                             weight))
    return shards


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).view(-1)


def _states(opt: MegatronOptimizer, shard: _Shard) -> dict[str, torch.Tensor]:
    """The fp32 main weight and Adam's moments of this rank's range (views)."""
    state = opt.optimizer.state[shard.main]
    return {"fp32_param": _flat(shard.main), **{k: _flat(state[k]) for k in OPTIMIZER_STATES}}


def _allocate_adam_state(opt: MegatronOptimizer, shard: _Shard) -> None:
    """The state torch's Adam creates on the first step, for a save or load before any step.
    Only ranges that exist on this rank: Megatron-FSDP gives an empty shard no gradient, so
    Adam never steps it, and a state there would keep another step count."""
    state = opt.optimizer.state[shard.main]
    if not state:
        state["step"] = torch.tensor(0.0)
        for key in OPTIMIZER_STATES:
            state[key] = torch.zeros_like(shard.main, memory_format=torch.preserve_format)


def sharded_state_dict(model: list, optimizer: MegatronOptimizer | None,
                       is_loading: bool) -> dict:
    """This rank's boxes: {"model": ..., "optimizer": {"common": [...], "boxes": {"0": ...}}},
    the structure the distributed optimizer's checkpoint has (optimizer_checkpoint)."""
    (wrapper,) = model  # Megatron-FSDP is wired for pure data parallelism: one chunk
    shards = _shards(wrapper)
    weights, states = {}, {}
    for index, shard in enumerate(shards):
        if shard.start == shard.end:
            continue
        param = torch.empty(shard.shape, device="meta")
        weight = {"weight": shard.weight}
        if optimizer is not None:
            _allocate_adam_state(optimizer, shard)
            own = _states(optimizer, shard)
            if is_loading:  # read into fresh buffers; load_state_dict copies them in
                own = {k: torch.empty_like(v) for k, v in own.items()}
            for name, box in slice_boxes(shard.sharded, param, shard.start, shard.end,
                                         own).items():
                states[f"{index}/{name}"] = box
        if is_loading:
            weight = {"weight": torch.empty_like(shard.weight)}
        for name, box in slice_boxes(shard.sharded, param, shard.start, shard.end, weight,
                                     key=lambda _state, key: key).items():
            weights[f"{index}/{name}"] = box
    state = {"model": {**weights, **_extra_states(getattr(wrapper, MAPPING_ATTR))}}
    if optimizer is not None:
        state["optimizer"] = {"common": [optimizer.state_dict()], "boxes": {"0": states}}
    return state


@torch.no_grad()
def load_state_dict(model: list, optimizer: MegatronOptimizer, requested: dict, loaded: dict,
                    load_optimizer: bool) -> None:
    """Copy what dist_checkpointing read into this rank's shards, then install the weights as
    megatron's optimizer step does (main weights -> model weights, parameter all-gather)."""
    (wrapper,) = model
    shards = _shards(wrapper)
    if load_optimizer:
        opt = optimizer
        common = common_for(opt.optimizer.param_groups, loaded["optimizer"]["common"])
        # Only ranges that exist on this rank hold a step (`_allocate_adam_state`).
        load_common(opt, common, [s.main for s in shards if s.start < s.end])
        targets = [_states(opt, s) if s.start < s.end else {} for s in shards]
        copy_boxes(requested["optimizer"]["boxes"]["0"], loaded["optimizer"]["boxes"]["0"],
                   targets)
    else:  # weights only (--finetune, --no-load-optim): the main weights start from them
        targets = [{"weight": _flat(s.main)} for s in shards]
        weights = [name for name in requested["model"] if not name.startswith(EXTRA_STATE)]
        copy_boxes(weights, loaded["model"], targets)
    wrapper.module.install_optimized_model_weights()
    wrapper.start_param_sync(force_sync=True)
