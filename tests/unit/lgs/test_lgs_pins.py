"""What `megatron_lgs.lgs.sync.install` assumes about megatron-core 0.16.1's DDP. When an
upgrade changes any of it, these fail before a run silently stops synchronizing."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import version

from megatron_lgs.lgs.sync import MEGATRON_CORE_VERSION  # installs the platform layer first

ddp_module = importlib.import_module("megatron.core.distributed.distributed_data_parallel")
finalize_module = importlib.import_module("megatron.core.distributed.finalize_model_grads")
buffer_module = importlib.import_module("megatron.core.distributed.param_and_grad_buffer")


def test_pinned_version():
    assert version("megatron-core") == MEGATRON_CORE_VERSION


def test_backward_hook_signals_readiness_through_the_param_to_group_map():
    hook = inspect.getsource(ddp_module.DistributedDataParallel._make_backward_post_hook)
    assert "param.main_grad.add_(param.grad.data)" in hook
    assert "self.param_to_bucket_group[param].register_grad_ready(" in hook
    assert "if self.ddp_config.overlap_grad_reduce:" in hook


def test_no_sync_marks_the_groups_not_last_micro_batch():
    source = inspect.getsource(ddp_module.DistributedDataParallel.no_sync)
    assert "bucket_group.is_last_microbatch = False" in source


def test_finalize_calls_the_chunks_finish_grad_sync():
    source = inspect.getsource(finalize_module.finalize_model_grads)
    assert "model_chunk.finish_grad_sync(force_all_reduce=force_all_reduce)" in source


def test_finishing_the_gradients_rearms_the_parameter_gather():
    """`install` replaces the DDP's finish_grad_sync, so it repeats what megatron's bucket
    groups do there besides the gradients; and the forward pre-hook gathers only where that
    mark is down."""
    finish = inspect.getsource(buffer_module._ParamAndGradBucketGroup.finish_grad_sync)
    assert "self.param_gather_dispatched = False" in finish
    gather = inspect.getsource(buffer_module._ParamAndGradBucketGroup.finish_param_sync)
    assert "if not self.param_gather_dispatched:" in gather
    ddp_finish = inspect.getsource(ddp_module.DistributedDataParallel.finish_grad_sync)
    assert "self.bucket_groups + self.expert_parallel_bucket_groups" in ddp_finish


def test_bucket_size_one_gives_one_bucket_per_parameter():
    source = inspect.getsource(buffer_module._ParamAndGradBuffer.__init__)
    assert "(param_end_index - bucket_start_index) >= bucket_size" in source
    assert "ddp_config.bucket_size = None" in inspect.getsource(
        ddp_module.DistributedDataParallel.__init__)  # only without overlap_grad_reduce


def test_a_ranks_shard_is_its_slice_and_grads_are_scaled_before_the_collective():
    assert "buffer[(r * shard_size) : ((r + 1) * shard_size)]" in inspect.getsource(
        buffer_module.shard_buffer)
    start = inspect.getsource(buffer_module._ParamAndGradBucketGroup.start_grad_sync)
    assert "bucket.grad_data *= bucket.gradient_scaling_factor" in start
    assert "reduce_op = torch.distributed.ReduceOp.SUM" in start
    init = inspect.getsource(buffer_module._ParamAndGradBucket.__init__)
    for attribute in ("self.params_list", "self.grad_data", "self.gradient_scaling_factor"):
        assert attribute in init


def test_all_to_all_reduce_scatter_is_megatrons_and_synchronous_when_asked():
    """LGS's hops call megatron's function (output, input, op, group, async_op), or for FP32
    its algorithm (all-to-all, then the sum), so that --reduce-scatter-with-fp32-accumulation
    reduces the same way on both sides."""
    from megatron.core.distributed import reduce_scatter_with_fp32_accumulation as rs

    params = list(inspect.signature(rs.reduce_scatter_with_fp32_accumulation).parameters)
    assert params == ["output_tensor", "input_tensor", "op", "group", "async_op"]
    source = inspect.getsource(rs.reduce_scatter_with_fp32_accumulation)
    assert "all_to_all_single" in source and "reduce_scatter_handle.wait()" in source
    assert "dist_reduce_scatter_func = reduce_scatter_with_fp32_accumulation" in \
        inspect.getsource(buffer_module._ParamAndGradBucketGroup.__init__)
