"""Optimizer state in model space: one checkpoint format for every optimizer sharding (a plain
optimizer, the distributed optimizer, Megatron-FSDP in `fsdp_checkpoint`) that loads into any
TP/PP/EP/DP layout, any gradient-bucket size and any of those shardings, with no gather and no
communication.

megatron-core 0.16.1 has no format of its own that does this here:
- `dp_reshardable` stores the flat gradient buckets: DP may change, TP, PP and buckets may not.
- `fully_reshardable` gathers each buffer with the padding between buckets cut out, then slices
  it with the padded offsets of `param_index_map`; from the second bucket on every parameter reads
  its neighbour's values (the "issue #504" TODO in `sharded_param_state_fully_reshardable`).
- `fully_sharded_model_space` marks its tensors with `flattened_range`, which 0.16.1's
  `ShardedTensor.validate_metadata_integrity` rejects.
- The plain optimizers' own format keys its per-parameter state by model tensor, but its common
  part is torch's state dict of each optimizer, and at EP > 1 megatron chains a second optimizer
  for the experts and prefixes its keys (`chained_1.`): it loads only into the same optimizer
  sharding and the same EP split, and not at all with `--optimizer sgd` (no `init_state_fn`).

Here each data-parallel rank writes exactly the slice of each parameter it owns (a plain
optimizer owns the whole of each of its parameters, replicated over DP as the model is). That
slice is a contiguous range of the parameter's flattened (tensor-parallel-local) tensor; it is cut
into boxes that are each contiguous in memory, and each box becomes a ShardedTensor of the
parameter's *global* tensor: the model's key and offsets, shifted by where the box sits.
dist_checkpointing writes the boxes as they are and, on load, reads the boxes of another layout
from the ones that overlap them. Keys follow megatron's model-space naming,
`optimizer.state.<state>.<model key>` with `fp32_param` and the optimizer's per-parameter state
(`exp_avg` and `exp_avg_sq`, or SGD's `momentum_buffer`); the step and the hyperparameters travel
in a small common record per inner optimizer (the distributed optimizer's `state_dict()`: param
groups with the step, and the loss scaler), the same on every rank. A load reads into fresh
buffers and copies them in, so during a load this rank's slice of the optimizer state exists
twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
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
from megatron.core.optimizer.optimizer import (
    Float16OptimizerWithFloat16Params,
    FP32Optimizer,
    param_group_identifier_keys,
)

FORMAT = "model_space_boxes"
# 2 (2026-12-07): plain optimizers save in this format too; before, in megatron-core's own.
FORMAT_VERSION = 2
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
                instance_id: int | None) -> ShardedTensor:
    _, offset, shape = box
    t = part.tensor
    pre = t.prepend_axis_num
    # Axes the model prepends (e.g. the layer index of `decoder.layers.*`) become size-1 axes of
    # the box: dist_checkpointing's uneven-shard path takes only plain boxes.
    global_offset = (*t.global_offset[:pre],
                     *(g + o for g, o in zip(t.global_offset[pre:], offset, strict=True)))
    local_shape = (*(1 for _ in range(pre)), *shape)
    # The model's replica id is (PP, TP, DP). The distributed optimizer's state is sharded over
    # DP, not replicated, and replicated over its instances (megatron's own rule); a plain
    # optimizer's (instance_id None) is replicated over DP as the model is.
    if not isinstance(t.replica_id, tuple) or len(t.replica_id) != 3:
        raise ReshardError(f"{t.key}: replica id {t.replica_id!r} is not (PP, TP, DP)")
    replica_id = t.replica_id if instance_id is None else (*t.replica_id[:2], instance_id)
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
                states: dict[str, torch.Tensor], instance_id: int | None = 0,
                key: Callable[[str, str], str] = state_key) -> dict[str, ShardedTensor]:
    """The checkpoint tensors of `states`, each the flat slice [start, end) of one state tensor
    of `param` (`sharded` is how the model saves `param`), named "<state>/<start in the slice>"
    and keyed `key(state, model key)` in the checkpoint. The returned tensors' data are views
    of `states`. `instance_id`: the distributed optimizer instance owning the slice, or None
    for state replicated over DP as the model is."""
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


def copy_boxes(names: Iterable[str], loaded: dict,
               targets: list[dict[str, torch.Tensor]]) -> None:
    """Copy each loaded box "<parameter index>/<state>/<start>" into that parameter's flat state
    tensor in `targets`."""
    for name in names:
        index, key, begin = name.split("/")
        value = loaded[name].reshape(-1)
        targets[int(index)][key][int(begin):int(begin) + value.numel()].copy_(value)


def _main_params(opt: MegatronOptimizer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(model parameter, the optimizer's parameter) of a plain optimizer: megatron's
    Float16OptimizerWithFloat16Params keeps an fp32 copy of each bf16/fp16 parameter, its
    FP32Optimizer steps the model's parameters themselves."""
    if isinstance(opt, Float16OptimizerWithFloat16Params):
        pairs = [(model, main) for models, mains in zip(opt.float16_groups,
                                                        opt.fp32_from_float16_groups, strict=True)
                 for model, main in zip(models, mains, strict=True)]
        return pairs + [(p, p) for group in opt.fp32_from_fp32_groups for p in group]
    if isinstance(opt, FP32Optimizer):
        return [(p, p) for group in opt.optimizer.param_groups for p in group["params"]]
    raise ReshardError(f"{type(opt).__name__}: this optimizer's state has no checkpoint mapping")


def _plain_state_names(opt: MegatronOptimizer) -> tuple[str, ...]:
    if opt.config.optimizer == "adam":
        return ("exp_avg", "exp_avg_sq")
    return ("momentum_buffer",) if opt.config.sgd_momentum else ()


def _plain_states(opt: MegatronOptimizer, main: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fp32 parameter and per-parameter state of `main`, flat views. State the optimizer has
    not made yet (no step taken) is made as its first step would start it: zero moments at
    step 0, a zero SGD momentum (megatron's SGD has no dampening, so the first step then
    leaves the gradient in it, as from none)."""
    state = opt.optimizer.state[main]
    for name in _plain_state_names(opt):
        if state.get(name) is None:
            state[name] = torch.zeros_like(main, memory_format=torch.preserve_format)
    if isinstance(opt.optimizer, torch.optim.Adam):  # torch's Adam/AdamW: a step per parameter
        state.setdefault("step", torch.tensor(0.0))
    return {"fp32_param": main.detach().view(-1),
            **{name: state[name].view(-1) for name in _plain_state_names(opt)}}


def _plain_step(opt: MegatronOptimizer) -> float:
    """The step count every parameter of a plain optimizer shares: torch's Adam keeps it per
    parameter, Transformer Engine's and Apex's fused Adam per param group, SGD none."""
    steps = {float(s["step"]) for s in opt.optimizer.state.values() if "step" in s}
    steps |= {float(g["step"]) for g in opt.optimizer.param_groups if "step" in g}
    if len(steps) > 1:
        raise ReshardError(f"the optimizer's parameters are at different steps {sorted(steps)}")
    return steps.pop() if steps else 0.0


def _plain_common(opt: MegatronOptimizer) -> dict:
    """What the distributed optimizer's `state_dict()` holds, for a plain optimizer: its param
    groups (without their parameters) with the step, and the loss scaler."""
    step = _plain_step(opt)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "step": step}
              for g in opt.optimizer.param_groups]
    common = {"optimizer": {"param_groups": groups}}
    if getattr(opt, "grad_scaler", None) is not None:
        common["grad_scaler"] = opt.grad_scaler.state_dict()
    return common


def _state_slices(opt: MegatronOptimizer) -> list[tuple[torch.Tensor, int, int,
                                                        dict[str, torch.Tensor]]]:
    """(model parameter, the flat range [start, end) this rank owns, its state tensors there)
    for every parameter the optimizer steps on this rank."""
    if isinstance(opt, DistributedOptimizer):
        return [(param, owned.start, owned.end, _param_states(opt, param))
                for param, owned in _owned_params(opt)]
    return [(param, 0, param.numel(), _plain_states(opt, main))
            for param, main in _main_params(opt)]


def _sharded(opt: MegatronOptimizer, by_param: dict, is_loading: bool) -> dict:
    """This rank's boxes of every parameter, named "<parameter index>/<state>/<start>"."""
    distributed = isinstance(opt, DistributedOptimizer)
    if is_loading and distributed:
        # Allocate the state that is loaded into (megatron's own idiom before a load).
        opt.load_state_dict(opt.state_dict())
    boxes = {}
    for index, (param, start, end, states) in enumerate(_state_slices(opt)):
        if param not in by_param:
            raise ReshardError("a parameter of the optimizer is missing from the model's "
                               "sharded state dict")
        if is_loading:  # read into fresh buffers; load_state_dict copies them in
            states = {k: torch.empty_like(v) for k, v in states.items()}
        instance = opt.distributed_optimizer_instance_id if distributed else None
        for name, box in slice_boxes(by_param[param], param, start, end, states,
                                     instance).items():
            boxes[f"{index}/{name}"] = box
    return boxes


def inner_optimizers(optimizer: MegatronOptimizer) -> list[MegatronOptimizer]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def sharded_state_dict(optimizer: MegatronOptimizer, model_sharded: ShardedStateDict,
                       is_loading: bool) -> dict:
    """The optimizer's checkpoint: per inner optimizer its common record (the same on all
    ranks) and this rank's boxes of every parameter's state."""
    by_param = {sh.data: sh for sh in nested_values(model_sharded)
                if isinstance(sh, ShardedTensor | ShardedTensorFactory)}
    inners = inner_optimizers(optimizer)
    return {
        "common": [o.state_dict() if isinstance(o, DistributedOptimizer) else _plain_common(o)
                   for o in inners],
        # Keyed by this layout's optimizer index: what the common part of a checkpoint holds
        # under "boxes" (another layout's structure, emptied) never lines up with a list here.
        "boxes": {str(i): _sharded(o, by_param, is_loading) for i, o in enumerate(inners)},
    }


def _group_identity(group: dict, relaxed: bool = False) -> tuple:
    keys = [k for k in param_group_identifier_keys if not (relaxed and k == "is_expert_parallel")]
    return tuple(group.get(k, group.get(f"pre_{k}")) for k in keys)


def common_for(param_groups: list[dict], saved: list[dict]) -> dict:
    """The common record of an optimizer with these (torch) param groups, from those saved by
    the optimizers of any layout: each of its param groups is found by megatron's identifier
    keys, with `is_expert_parallel` relaxed (megatron puts expert parameters into the dense
    optimizer at EP1 and into their own at EP > 1; the group's hyperparameters and the step are
    the same either way)."""
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


def load_common(opt: MegatronOptimizer, common: dict, mains: list[torch.Tensor]) -> None:
    """Set the hyperparameters, the step and the loss scaler of a plain optimizer or of
    Megatron-FSDP's from a common record; `mains`: the optimizer's parameters that hold a step
    (torch's Adam keeps one per parameter, a fused Adam one per param group)."""
    step = 0.0
    for group, saved in zip(opt.optimizer.param_groups, common["optimizer"]["param_groups"],
                            strict=True):
        group.update({k: v for k, v in saved.items() if k not in ("params", "step")})
        step = saved.get("step", step)
    if getattr(opt, "grad_scaler", None) is not None and "grad_scaler" in common:
        opt.grad_scaler.load_state_dict(common["grad_scaler"])
    if isinstance(opt.optimizer, torch.optim.Adam):
        for main in mains:
            opt.optimizer.state[main]["step"] = torch.tensor(float(step))
    elif opt.config.optimizer == "adam":  # fused Adam
        for group in opt.optimizer.param_groups:
            group["step"] = int(step)


@torch.no_grad()
def load_state_dict(optimizer: MegatronOptimizer, requested: dict, loaded: dict) -> None:
    """Put the loaded boxes back into each parameter's state. `requested` is what
    `sharded_state_dict(..., is_loading=True)` returned, `loaded` what dist_checkpointing read.
    The number and kind of inner optimizers may differ from the saving layout's (see
    `common_for`)."""
    for i, opt in enumerate(inner_optimizers(optimizer)):
        common = common_for(opt.optimizer.param_groups, loaded["common"])
        if isinstance(opt, DistributedOptimizer):
            opt.load_state_dict(common)  # replaces its state tensors: take the slices after
        else:
            load_common(opt, common, [main for _, main in _main_params(opt)])
        slices = _state_slices(opt)
        targets = [states for *_, states in slices]
        copy_boxes(requested["boxes"][str(i)], loaded["boxes"][str(i)], targets)
        if isinstance(opt, DistributedOptimizer):
            for (param, *_), states in zip(slices, targets, strict=True):
                tensors = opt._get_main_param_and_optimizer_states(param)  # keeps Adam's step
                tensors["param"] = states.pop("fp32_param")
                tensors.update(states)
                opt._set_main_param_and_optimizer_states(param, tensors)
