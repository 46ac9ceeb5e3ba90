"""The distributed optimizer's state in model space: a checkpoint that loads into any TP/PP/DP
layout and any gradient-bucket size, with no gather and no communication.

megatron-core 0.16.1 has no format of its own that does this here:
- `dp_reshardable` stores the flat gradient buckets: DP may change, TP, PP and buckets may not.
- `fully_reshardable` gathers each buffer with the padding between buckets cut out, then slices
  it with the padded offsets of `param_index_map`; from the second bucket on every parameter reads
  its neighbour's values (the "issue #504" TODO in `sharded_param_state_fully_reshardable`).
- `fully_sharded_model_space` marks its tensors with `flattened_range`, which 0.16.1's
  `ShardedTensor.validate_metadata_integrity` rejects.

Here each data-parallel rank writes exactly the slice of each parameter it owns. That slice is a
contiguous range of the parameter's flattened (tensor-parallel-local) tensor; it is cut into
boxes that are each contiguous in memory, and each box becomes a ShardedTensor of the parameter's
*global* tensor: the model's key and offsets, shifted by where the box sits. dist_checkpointing
writes the boxes as they are and, on load, reads the boxes of another layout from the ones that
overlap them. Keys follow megatron's model-space naming, `optimizer.state.<state>.<model key>`
with `fp32_param`, `exp_avg` and `exp_avg_sq`; Adam's step and the hyperparameters travel in the
optimizer's ordinary state dict (param groups and loss scaler), which is the same on every rank.
A load reads into fresh buffers and copies them in, so during a load this rank's slice of the
optimizer state exists twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import (
    ShardedBase,
    ShardedStateDict,
    ShardedTensor,
    ShardedTensorFactory,
)
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer.optimizer import param_group_identifier_keys

FORMAT = "model_space_boxes"
STATE_PREFIX = "optimizer.state"


class ReshardError(RuntimeError):
    """A parameter's checkpoint mapping that this format cannot express."""


Box = tuple[int, tuple[int, ...], tuple[int, ...]]  # (flat start, offset, shape)


def contiguous_boxes(shape: tuple[int, ...], start: int, end: int) -> list[Box]:
    """Cut the flat range [start, end) of a row-major tensor of `shape` into boxes, each contiguous
    in memory, in flat order: a partial first row, a block of whole rows, a partial last row
    (the partial rows cut the same way one dimension down)."""
    if start >= end:
        return []
    if not shape:
        return [(0, (), ())]
    row = math.prod(shape[1:])
    rest = tuple(0 for _ in shape[1:])
    boxes: list[Box] = []

    def partial_row(lo: int, hi: int) -> None:
        r = lo // row
        boxes.extend((r * row + s, (r, *o), (1, *sh))
                     for s, o, sh in contiguous_boxes(shape[1:], lo - r * row, hi - r * row))

    if start % row:
        head_end = min(end, (start // row + 1) * row)
        partial_row(start, head_end)
        start = head_end
    whole_end = end - end % row
    if whole_end > start:
        boxes.append((start, (start // row, *rest), ((whole_end - start) // row, *shape[1:])))
        start = whole_end
    if start < end:
        partial_row(start, end)
    return boxes


@dataclass(frozen=True)
class _Part:
    """A regular ShardedTensor of the model (no data) and where it starts in its parameter's
    flattened local tensor; its elements are the next `numel` elements of that tensor."""

    tensor: ShardedTensor
    param_start: int
    numel: int


def _parts(sharded: ShardedBase, param: torch.Tensor) -> list[_Part]:
    """The regular ShardedTensors a model parameter is saved as. A factory (e.g. SwiGLU's fc1
    under TP, two halves at two global places) is built on a tensor of flat positions, so each
    resulting tensor says which elements of the parameter it holds."""
    positions = torch.arange(param.numel()).view(param.shape)
    if isinstance(sharded, ShardedTensorFactory):
        built = sharded.build_fn(sharded.key, positions, sharded.replica_id, None)
        tensors = list(nested_values(built)) if isinstance(built, dict | list) else [built]
    else:
        tensors = [replace(sharded, data=positions, dtype=positions.dtype)]
    parts = []
    for tensor in tensors:
        if not isinstance(tensor, ShardedTensor) or tensor.flattened_range is not None:
            raise ReshardError(f"{sharded.key}: its checkpoint mapping is not a plain "
                               f"ShardedTensor ({type(tensor).__name__})")
        flat = tensor.data.reshape(-1)
        first = int(flat[0]) if flat.numel() else 0
        if not torch.equal(flat, torch.arange(first, first + flat.numel())):
            raise ReshardError(f"{sharded.key}: a part of its checkpoint mapping is not a "
                               f"contiguous range of the parameter; cannot save its optimizer "
                               f"state by parameter")
        parts.append(_Part(replace(tensor, data=None), first, flat.numel()))
    return parts


def state_key(state: str, model_key: str) -> str:
    """The checkpoint key of an optimizer state tensor of the model tensor `model_key`."""
    return f"{STATE_PREFIX}.{state}.{model_key}"


def _box_tensor(part: _Part, key: str, box: Box, data: torch.Tensor,
                instance_id: int) -> ShardedTensor:
    _, offset, shape = box
    t = part.tensor
    pre = t.prepend_axis_num
    # Axes the model prepends (e.g. the layer index of `decoder.layers.*`) become size-1 axes of
    # the box: dist_checkpointing's uneven-shard path takes only plain boxes.
    global_offset = (*t.global_offset[:pre],
                     *(g + o for g, o in zip(t.global_offset[pre:], offset, strict=True)))
    local_shape = (*(1 for _ in range(pre)), *shape)
    # The model's replica id is (PP, TP, DP); optimizer state is sharded over DP, not
    # replicated, and replicated over distributed-optimizer instances (megatron's own rule).
    if not isinstance(t.replica_id, tuple) or len(t.replica_id) != 3:
        raise ReshardError(f"{t.key}: replica id {t.replica_id!r} is not (PP, TP, DP)")
    replica_id = (*t.replica_id[:2], instance_id)
    return ShardedTensor(key, data.view(local_shape),
                         data.dtype, local_shape, t.global_shape, global_offset,
                         axis_fragmentations=None, replica_id=replica_id)


def _param_states(opt: DistributedOptimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """This rank's flat slice of the fp32 main parameter and of each optimizer state tensor."""
    tensors = opt._get_main_param_and_optimizer_states(param)
    tensors["fp32_param"] = tensors.pop("param")
    # Adam's step is one number for all parameters, kept in the param groups.
    return {k: v for k, v in tensors.items() if k != "step"}


def _owned_params(opt: DistributedOptimizer):
    """(model parameter, its flat range owned by this rank), for every parameter with one."""
    for per_dtype in opt.gbuf_ranges:
        for buckets in per_dtype.values():
            for bucket in buckets:
                for param, ranges in bucket["param_map"].items():
                    yield param, ranges["param"]


def slice_boxes(sharded: ShardedBase, param: torch.Tensor, start: int, end: int,
                states: dict[str, torch.Tensor], instance_id: int = 0,
                key: Callable[[str, str], str] = state_key) -> dict[str, ShardedTensor]:
    """The checkpoint tensors of `states`, each the flat slice [start, end) of one state tensor
    of `param` (`sharded` is how the model saves `param`), named "<state>/<start in the slice>"
    and keyed `key(state, model key)` in the checkpoint. The returned tensors' data are views
    of `states`."""
    boxes = {}
    for part in _parts(sharded, param):
        lo = max(start, part.param_start)
        hi = min(end, part.param_start + part.numel)
        for box in contiguous_boxes(part.tensor.local_shape, lo - part.param_start,
                                    hi - part.param_start):
            begin = part.param_start + box[0] - start
            for name, flat in states.items():
                piece = flat.detach()[begin:begin + math.prod(box[2])]
                boxes[f"{name}/{begin}"] = _box_tensor(part, key(name, part.tensor.key), box,
                                                       piece, instance_id)
    return boxes


def _distributed_sharded(opt: DistributedOptimizer, by_param: dict, is_loading: bool) -> dict:
    """This rank's boxes of every parameter, named "<parameter index>/<state>/<start>"."""
    if is_loading:
        # Allocate the state that is loaded into (megatron's own idiom before a load).
        opt.load_state_dict(opt.state_dict())
    boxes = {}
    for index, (param, owned) in enumerate(_owned_params(opt)):
        if param not in by_param:
            raise ReshardError("a parameter of the optimizer is missing from the model's "
                               "sharded state dict")
        states = _param_states(opt, param)
        if is_loading:  # read into fresh buffers; load_state_dict copies them in
            states = {k: torch.empty_like(v) for k, v in states.items()}
        for name, box in slice_boxes(by_param[param], param, owned.start, owned.end, states,
                                     opt.distributed_optimizer_instance_id).items():
            boxes[f"{index}/{name}"] = box
    return boxes


def _inner_optimizers(optimizer: MegatronOptimizer) -> list[MegatronOptimizer]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def uses_model_space(optimizer: MegatronOptimizer) -> bool:
    return any(isinstance(o, DistributedOptimizer) for o in _inner_optimizers(optimizer))


def sharded_state_dict(optimizer: MegatronOptimizer, model_sharded: ShardedStateDict,
                       is_loading: bool) -> dict:
    """The distributed optimizer's checkpoint: per inner optimizer its ordinary state dict
    (common to all ranks) and this rank's boxes of every parameter's state."""
    by_param = {sh.data: sh for sh in nested_values(model_sharded)
                if isinstance(sh, ShardedTensor | ShardedTensorFactory)}
    inners = _inner_optimizers(optimizer)
    return {
        "common": [o.state_dict() for o in inners],
        # Keyed by this layout's optimizer index: what the common part of a checkpoint holds
        # under "boxes" (another layout's structure, emptied) never lines up with a list here.
        "boxes": {str(i): _distributed_sharded(o, by_param, is_loading)
                  for i, o in enumerate(inners)},
    }


def _group_identity(group: dict, relaxed: bool = False) -> tuple:
    keys = [k for k in param_group_identifier_keys if not (relaxed and k == "is_expert_parallel")]
    return tuple(group.get(k, group.get(f"pre_{k}")) for k in keys)


def common_for(param_groups: list[dict], saved: list[dict]) -> dict:
    """The ordinary state dict of an optimizer with these (torch) param groups, from those saved
    by the optimizers of any layout: each of its param groups is found by megatron's identifier
    keys, with `is_expert_parallel` relaxed (megatron puts expert parameters into the dense
    optimizer at EP1 and into their own at EP > 1; the group's hyperparameters and Adam's step
    are the same either way)."""
    saved_groups = [g for state in saved for g in state["optimizer"]["param_groups"]]
    groups = []
    for group in param_groups:
        match = [g for g in saved_groups if _group_identity(g) == _group_identity(group)] or [
            g for g in saved_groups
            if _group_identity(g, relaxed=True) == _group_identity(group, relaxed=True)]
        if not match:
            raise ReshardError(f"the checkpoint has no optimizer parameter group with "
                               f"{param_group_identifier_keys} = {_group_identity(group)}")
        groups.append({**match[0], "is_expert_parallel": group["is_expert_parallel"]})
    return {**saved[0], "optimizer": {**saved[0]["optimizer"], "param_groups": groups}}


@torch.no_grad()
def load_state_dict(optimizer: MegatronOptimizer, requested: dict, loaded: dict) -> None:
    """Put the loaded boxes back into each parameter's flat slice. `requested` is what
    `sharded_state_dict(..., is_loading=True)` returned, `loaded` what dist_checkpointing read.
    The number of inner optimizers may differ from the saving layout's (see `common_for`)."""
    for i, opt in enumerate(_inner_optimizers(optimizer)):
        names, boxes = requested["boxes"][str(i)], loaded["boxes"][str(i)]
        opt.load_state_dict(common_for(opt.optimizer.param_groups, loaded["common"]))
        owned = [param for param, _ in _owned_params(opt)]
        slices = [_param_states(opt, param) for param in owned]
        for name in names:
            index, key, begin = name.split("/")
            value = boxes[name].reshape(-1)
            slices[int(index)][key][int(begin):int(begin) + value.numel()].copy_(value)
        for param, states in zip(owned, slices, strict=True):
            tensors = opt._get_main_param_and_optimizer_states(param)  # keeps Adam's step
            tensors["param"] = states.pop("fp32_param")
            tensors.update(states)
            opt._set_main_param_and_optimizer_states(param, tensors)
