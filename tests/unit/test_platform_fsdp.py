"""The CPU patches that let Megatron-FSDP (ZeRO-3) run with gloo, each checked against the
megatron-core source it was written for, so that an upgrade fails here, loudly."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from megatron_lgs import platform

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU compatibility layer")


def _source(module_name: str) -> str:
    return inspect.getsource(importlib.import_module(module_name))


def test_megatron_fsdp_still_builds_a_device_name_from_current_device():
    assert 'torch.device(f"cuda:{torch.cuda.current_device()}")' in \
        _source(platform._FSDP_MODULE)
    fsdp = importlib.import_module(platform._FSDP_MODULE)
    assert fsdp.torch.device("cuda:cpu") == torch.device("cpu")
    assert fsdp.torch.device("cpu") == torch.device("cpu")
    assert torch.device("cuda:0").type == "cuda"  # torch itself is untouched


def test_fsdp_adapter_still_builds_cuda_meshes_and_gets_cpu_ones():
    assert 'device_type="cuda"' in _source(platform._FSDP_ADAPTER)
    adapter = importlib.import_module(platform._FSDP_ADAPTER)
    assert adapter.DeviceMesh.__name__ == "CpuDeviceMesh"


def test_fsdp_gradient_division_fusion_is_nccl_only_and_switchable():
    # wrap_ddp turns gradient_reduce_div_fusion off on CPU: gloo has no PREMUL_SUM.
    source = _source("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer")
    assert "ddp_config.gradient_reduce_div_fusion" in source
    assert "_make_nccl_premul_sum" in source


def test_noop_event_can_be_waited_on():
    torch.cuda.Event().wait()
    torch.cuda.Event().wait(torch.cuda.current_stream())


def test_fsdp_parameter_gathers_are_made_synchronous():
    source = _source(platform._FSDP_BUFFERS)
    assert "from torch.distributed import _coalescing_manager" in source
    assert "async_ops=async_param_gather" in source
    buffers = importlib.import_module(platform._FSDP_BUFFERS)
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)

    platform._synchronous(fake)(None, async_ops=True)
    assert seen == {"async_ops": False}
    assert buffers._coalescing_manager.__name__ == "manager"
