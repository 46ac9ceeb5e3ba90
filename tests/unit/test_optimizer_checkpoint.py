"""The distributed optimizer's checkpoint boxes: a rank's flat slice of a parameter, cut into
boxes of the global tensor, lands exactly where the model saves that parameter — including
megatron's layer-stacked keys and SwiGLU's two-halves factory under tensor parallelism."""

from __future__ import annotations

import math
import random

import pytest
import torch

from megatron_lgs.optimizer_checkpoint import contiguous_boxes, slice_boxes


@pytest.mark.parametrize("seed", range(20))
def test_boxes_are_contiguous_and_cover_the_range_in_order(seed):
    rng = random.Random(seed)
    shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 4)))
    numel = math.prod(shape)
    start = rng.randint(0, numel - 1)
    end = rng.randint(start, numel)
    positions = torch.arange(numel).view(shape)
    covered = []
    for flat_start, offset, size in contiguous_boxes(shape, start, end):
        box = positions[tuple(slice(o, o + s) for o, s in zip(offset, size, strict=True))]
        flat = box.reshape(-1)
        assert torch.equal(flat, torch.arange(flat_start, flat_start + flat.numel()))
        covered.extend(flat.tolist())
    assert covered == list(range(start, end))


def _reassemble(global_shape, shards, dp_size: int) -> torch.Tensor:
    """Cut every tensor-parallel rank's local parameter into `dp_size` flat slices, turn each
    into boxes, and write the boxes into one global tensor at their global offsets."""
    out = torch.full(global_shape, float("nan"))
    hits = torch.zeros(global_shape, dtype=torch.int64)
    for sharded, local in shards:
        flat = local.reshape(-1)
        bounds = [round(i * flat.numel() / dp_size) for i in range(dp_size + 1)]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            for box in slice_boxes(sharded, local, lo, hi, {"exp_avg": flat[lo:hi]}).values():
                assert box.key == f"optimizer.state.exp_avg.{sharded.key}"
                where = tuple(slice(o, o + s) for o, s in zip(box.global_offset, box.local_shape,
                                                               strict=True))
                out[where] = box.data
                hits[where] += 1
    assert torch.equal(hits, torch.ones_like(hits))  # every element written exactly once
    return out


@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 3), (4, 2)])
def test_layer_stacked_row_parallel_weight(tp, dp):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor  # after megatron_lgs

    layers, rows, cols = 3, 5, 8
    full = torch.randn(layers, rows, cols * tp)
    shards = []
    for layer in range(layers):
        for rank in range(tp):
            local = full[layer, :, rank * cols:(rank + 1) * cols].clone()
            sharded = ShardedTensor.from_rank_offsets(
                "decoder.layers.mlp.linear_fc2.weight", local, (0, layer, layers),
                (2, rank, tp), replica_id=(0, 0, 0), prepend_axis_num=1)
            shards.append((sharded, local))
    assert torch.equal(_reassemble(full.shape, shards, dp), full)


@pytest.mark.parametrize("tp,dp", [(1, 2), (2, 3)])
def test_swiglu_factory_halves_go_to_their_global_places(tp, dp):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor  # after megatron_lgs
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    # Global fc1 of a gated MLP: [w_0 .. w_tp-1, v_0 .. v_tp-1] along the output axis; rank r
    # holds cat(w_r, v_r) (megatron's apply_swiglu_sharded_factory).
    half, cols = 3, 4
    full = torch.randn(2 * tp * half, cols)
    shards = []
    for rank in range(tp):
        w = full[rank * half:(rank + 1) * half]
        v = full[(tp + rank) * half:(tp + rank + 1) * half]
        local = torch.cat([w, v])
        original = ShardedTensor.from_rank_offsets(
            "decoder.layers.0.mlp.linear_fc1.weight", local, (0, rank, tp), replica_id=(0, 0, 0))
        shards.append((apply_swiglu_sharded_factory(original, ()), local))
    assert torch.equal(_reassemble(full.shape, shards, dp), full)


def test_megatron_formats_still_cannot_reshard_this_way():
    """Why this module exists (megatron-core 0.16.1). If an upgrade fixes one of megatron's own
    formats, this fails: re-evaluate using megatron's format instead."""
    import inspect

    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    # Buckets are padded (to lcm(DP, 128) elements), at DP=1 too ...
    assert "math.lcm(self.data_parallel_world_size, 128" in inspect.getsource(_ParamAndGradBuffer)
    # ... fully_reshardable's gathered buffer drops that padding between buckets ...
    gather = inspect.getsource(DistributedOptimizer.get_parameter_state_dp_zero)
    assert "offset_in_world_tensors += gbuf_world_numel_unpadded" in gather
    # ... and is then sliced with the padded offsets of param_index_map.
    slicing = inspect.getsource(DistributedOptimizer.sharded_param_state_fully_reshardable)
    assert "buffer.param_index_map.items()" in slicing
    assert "world_tensors[state_key][param_world_start:param_world_end]" in slicing
    # fully_sharded_model_space marks its tensors with flattened_range, which is refused.
    with pytest.raises(CheckpointingException, match="flattened_range"):
        ShardedTensor("x", torch.zeros(4), torch.float32, (2, 2), (2, 2), (0, 0), None,
                      flattened_range=slice(0, 4))
