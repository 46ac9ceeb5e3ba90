"""What the Megatron-FSDP checkpoint (megatron_lgs/fsdp_checkpoint.py) reads from megatron-core
0.16.1, checked against its source so that an upgrade fails here, loudly."""

from __future__ import annotations

import inspect

from megatron.core.distributed.fsdp.src.megatron_fsdp import megatron_fsdp, param_and_grad_buffer


def test_each_optimizer_parameter_knows_its_original_and_its_flat_range():
    source = inspect.getsource(param_and_grad_buffer.ParamAndGradBuffer
                               ._init_optimizer_named_parameters)
    assert 'setattr(dist_param, "orig_param", orig_param)' in source
    assert 'setattr(dist_param, "megatron_fsdp_slice", slice(_start, _end))' in source
    # ... the range of the model weight buffer, the one main weights and moments share.
    assert "_get_item_slice_in_shard(item_id)" in source
    buffers = inspect.getsource(param_and_grad_buffer.ParamAndGradBuffer
                                .copy_model_weights_to_main_weights)
    assert "wbuf.get_shard_from_local_buffer()" in buffers  # symmetric shards


def test_the_wrapped_module_swaps_in_dtensors_before_any_state_dict():
    """Why the mapping is recorded before wrapping: afterwards a state-dict pre-hook on every
    module installs the DTensor shards."""
    source = inspect.getsource(megatron_fsdp.MegatronFSDP._register_fsdp_hooks)
    assert "register_state_dict_pre_hook" in source
    assert "_replace_param_with_distributed_if_needed()" in source


def test_installing_weights_is_what_the_optimizer_step_does():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    step = inspect.getsource(DistributedOptimizer._copy_main_params_to_model_params)
    assert "copy_main_weights_to_model_weights()" in step
    install = inspect.getsource(megatron_fsdp.MegatronFSDP.install_optimized_model_weights)
    assert "copy_main_weights_to_model_weights()" in install
