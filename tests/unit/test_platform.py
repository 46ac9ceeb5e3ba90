"""The platform layer: device choice, the Transformer Engine probe, and the CPU patches, each
checked against the megatron-core it was written for so that an upgrade fails here, loudly."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap
from importlib.metadata import version

import pytest
import torch

from megatron_lgs import platform
from tests.conftest import REPO, _base_env

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU compatibility layer")


def test_pinned_megatron_core_version():
    assert version("megatron-core") == platform.MEGATRON_CORE_VERSION, (
        "megatron-core changed: re-check every entry of CPU_PATCHES and NO_TE_FIXES "
        "against the new source, then update MEGATRON_CORE_VERSION")


def test_cpu_platform_uses_gloo_and_no_te():
    p = platform.get_platform()
    assert p.device.type == "cpu" and p.backend == "gloo" and not p.te_available
    assert p.te_error


@pytest.mark.parametrize("module_name", platform._CUDA_FACTORY_MODULES)
def test_each_factory_patch_targets_a_module_that_still_hardcodes_cuda(module_name):
    source = inspect.getsource(importlib.import_module(module_name))
    assert 'device="cuda"' in source or "device='cuda'" in source, (
        f"{module_name} no longer creates tensors on device='cuda'; drop it from the list")


@pytest.mark.parametrize("module_name", platform._PINNED_MEMORY_MODULES)
def test_each_pinned_memory_patch_targets_a_module_that_still_pins(module_name):
    module = importlib.import_module(module_name)
    assert "pin_memory=True" in inspect.getsource(module)
    assert module.torch.tensor([1], pin_memory=True).device.type == "cpu"


def test_sync_save_queue_replaces_the_spawned_manager_megatron_would_start():
    writer = importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    source = inspect.getsource(writer._get_write_results_queue)
    assert "if _results_queue is None:" in source and 'get_context("spawn")' in source
    assert writer._get_write_results_queue() is writer._results_queue
    assert type(writer._results_queue).__module__ == "queue"


def test_async_save_queue_reaches_the_parent_from_the_forked_writer():
    """What megatron's TemporalAsyncCaller does with the queue, on a payload larger than a pipe
    holds: the forked writer puts its results and exits; the parent reads them after the join."""
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import async_utils

    source = inspect.getsource(async_utils.TemporalAsyncCaller.schedule_async_call)
    assert "mp.get_context('fork')" in source  # the writer is forked: a fork-born server serves
    writer = importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    before = writer._results_queue
    try:
        platform.use_forked_save_queue()
        results = writer._get_write_results_queue()
        payload = {i: ["x" * 100] * 10 for i in range(200)}  # ~200 KB, over a pipe's 64 KiB
        child = multiprocessing.get_context("fork").Process(target=results.put, args=(payload,))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert results.get_nowait() == payload
    finally:
        writer._results_queue = before
        manager = platform._FORKED_MANAGER.pop()
        manager.shutdown()


def test_factory_patch_puts_cuda_tensors_on_cpu_and_leaves_torch_alone():
    clip_grads = importlib.import_module("megatron.core.optimizer.clip_grads")
    t = clip_grads.torch.zeros(2, device="cuda")
    assert t.device.type == "cpu"
    assert clip_grads.torch is not torch and torch.zeros is not clip_grads.torch.zeros


def test_rng_tracker_forks_the_cpu_generator_and_restores_it():
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, initialize_rng_tracker

    initialize_rng_tracker(force_reset=True)
    tracker = get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", 77)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with tracker.fork("model-parallel-rng"):
        forked = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)  # the default stream is untouched
    tracker.reset()
    tracker.add("model-parallel-rng", 77)
    with tracker.fork("model-parallel-rng"):
        assert torch.equal(torch.rand(3), forked)  # the fork is its own reproducible stream


def test_moe_split_sizes_become_numpy_on_cpu():
    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    assert "as_numpy=True" in inspect.getsource(dispatcher)  # what the patch serves
    splits = dispatcher.maybe_move_tensor_to_cpu(torch.tensor([3, 1]), as_numpy=True)
    assert list(splits) == [3, 1] and not torch.is_tensor(splits)


def test_type_name_patch_only_changes_the_no_argument_form():
    x = torch.zeros(2)
    assert x.type() == "torch.cuda.FloatTensor"
    assert x.type(torch.float64).dtype == torch.float64
    assert torch.zeros(2, dtype=torch.int64).type() == "torch.LongTensor"


def test_no_te_fixes_still_address_megatron_source():
    """Each fix corresponds to lines in megatron-core 0.16.1; when they change, re-check."""
    from megatron.core.optimizer import distrib_optimizer

    assert not distrib_optimizer.HAVE_APEX_OR_TE
    source = inspect.getsource(distrib_optimizer)
    assert 'steps = list(set([s["step"].item() for s in inner_state_dict["state"].values()]))' \
        in source
    assert 's["step"] = step' in source
    assert "dst_tensors[key].copy_(tensors[key])" in source
    assert set(platform.NO_TE_FIXES)  # documented
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    assert "if te_general_gemm is not None" in inspect.getsource(moe_utils)
    assert moe_utils.te_general_gemm is None


def _import_with_fake_te(tmp_path, init_source: str) -> str:
    fake = tmp_path / "transformer_engine"
    fake.mkdir()
    if init_source:
        (fake / "__init__.py").write_text(init_source)
    script = textwrap.dedent("""
        import megatron_lgs
        from megatron_lgs.platform import get_platform
        from megatron.core.models.gpt import gpt_layer_specs
        from megatron.core import utils
        p = get_platform()
        print("TE_AVAILABLE", p.te_available)
        print("SPEC_HAVE_TE", gpt_layer_specs.HAVE_TE)
        print("UTILS_TE_VERSION", utils.get_te_version())
        print("REASON", p.te_error)
    """)
    env = {**_base_env(), "PYTHONPATH": f"{tmp_path}:{REPO}"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_te_that_raises_on_import_is_hidden_from_megatron(tmp_path):
    out = _import_with_fake_te(
        tmp_path, "raise RuntimeError('CUDA driver not found (fake TE)')\n")
    assert "TE_AVAILABLE False" in out and "SPEC_HAVE_TE False" in out
    assert "UTILS_TE_VERSION None" in out
    assert "RuntimeError: CUDA driver not found" in out


def test_an_empty_te_folder_is_hidden_from_megatron(tmp_path):
    out = _import_with_fake_te(tmp_path, "")
    assert "TE_AVAILABLE False" in out and "SPEC_HAVE_TE False" in out
