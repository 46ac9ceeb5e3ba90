"""Which device and collective backend this process uses, and what megatron-core needs to run here.

On a machine with CUDA nothing is patched: NCCL, CUDA tensors, and Transformer Engine when it
imports. Without CUDA, megatron-core 0.16.1 still calls CUDA APIs directly in a few dozen places;
`install()` redirects exactly those, each patch listed in `CPU_PATCHES` with the reason, so the
real megatron-core code (GPTModel, DDP, distributed optimizer, dist_checkpointing, schedules) runs
on CPU with gloo. `tests/unit/test_platform.py` fails loudly if an upgrade moves what is patched.

`install()` must run before anything imports megatron.core; `megatron_lgs/__init__.py` calls it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import multiprocessing
import queue
import sys
import types
import warnings
from dataclasses import dataclass

import torch

MEGATRON_CORE_VERSION = "0.16.1"

# CPython gh-112275, fixed in 3.11.10: a child forked while another thread creates a Python
# thread state (gloo's workers do, to release tensors) can hang before it runs a line.
FORK_MAY_DEADLOCK = sys.version_info < (3, 11, 10)

_TE_MODULE = "transformer_engine"


@dataclass(frozen=True)
class Platform:
    device: torch.device
    backend: str
    te_available: bool
    te_error: str | None  # why Transformer Engine is unusable, when it is

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


_PLATFORM: Platform | None = None


def _probe_transformer_engine() -> str | None:
    """Import TE once; return None when usable, else the reason. Never raises.

    TE raises RuntimeError (not ImportError) when CUDA is missing, which megatron-core does not
    catch; an empty leftover `transformer_engine` folder imports fine and makes megatron-core
    believe TE is there. Either way the broken TE is hidden before megatron-core looks for it.
    """
    if importlib.util.find_spec(_TE_MODULE) is None:
        return "transformer_engine is not installed"
    try:
        te_pytorch = importlib.import_module(f"{_TE_MODULE}.pytorch")
        if not hasattr(te_pytorch, "Linear"):
            raise ImportError("transformer_engine.pytorch has no Linear (incomplete install)")
        if not torch.cuda.is_available():
            raise RuntimeError("Transformer Engine needs CUDA, and CUDA is not available")
    except Exception as exc:  # any failure means: do not let megatron-core use it
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        for name in [m for m in sys.modules if m == _TE_MODULE or m.startswith(_TE_MODULE + ".")]:
            del sys.modules[name]
        # A None entry makes every later `import transformer_engine` raise ImportError.
        sys.modules[_TE_MODULE] = None  # type: ignore[assignment]
        return reason
    return None


def get_platform() -> Platform:
    """The platform of this process (probing and patching on first use)."""
    install()
    assert _PLATFORM is not None
    return _PLATFORM


def install() -> Platform:
    """Probe the machine once; on CPU install the compatibility patches. Idempotent."""
    global _PLATFORM
    if _PLATFORM is not None:
        return _PLATFORM
    if "megatron.core" in sys.modules and not torch.cuda.is_available():
        raise RuntimeError(
            "megatron.core was imported before megatron_lgs.platform.install(); "
            "import megatron_lgs first"
        )
    te_error = _probe_transformer_engine()
    # megatron-core warns at import, module by module, that TE/Apex are missing; the trainer's
    # start-up line states it once. Its own default cuda_graph_scope trips its own deprecation.
    warnings.filterwarnings("ignore", message=r".*(not installed|Falling back)", module="megatron")
    warnings.filterwarnings("ignore", message="full scope is deprecated", module="megatron")
    # megatron-core 0.16.1 calls torch.distributed.checkpoint APIs that torch deprecates
    # (ShardedTensor, load_state_dict): nothing a user of this trainer can act on.
    warnings.filterwarnings("ignore", message=".*deprecating ShardedTensor", category=FutureWarning)
    warnings.filterwarnings("ignore", message="`load_state_dict` is deprecated",
                            category=FutureWarning)
    if torch.cuda.is_available():
        _PLATFORM = Platform(torch.device("cuda"), "nccl", te_error is None, te_error)
    else:
        _install_cpu_patches()
        _PLATFORM = Platform(torch.device("cpu"), "gloo", False, te_error)
    _install_no_te_fixes()
    _install_sync_save_queue()
    return _PLATFORM


# --------------------------------------------------------------------------------------------
# Checkpoint saves, on every platform.
# --------------------------------------------------------------------------------------------

SAVE_FIXES: dict[str, str] = {
    "filesystem_async._results_queue": "megatron-core creates the queue its file writers report "
    "to as a spawn-context multiprocessing Manager, for saves finished by another process; it "
    "starts a server process that re-imports the entry script (about 4 s on the first save of "
    "every run, and a hang without an `if __name__ == '__main__'` guard). A synchronous save "
    "puts and reads the writers' results in the training process, so a plain queue.Queue "
    "serves. An asynchronous save (--async-save) puts them from the process megatron forks to "
    "write, which a plain queue would lose: `use_forked_save_queue` swaps in a Manager queue "
    "whose server is forked, not spawned (no re-import). Not a pipe-backed multiprocessing "
    "Queue: the writer exits only once its results are in the pipe, and megatron reads them "
    "only after the writer has exited, so results over the pipe's 64 KiB would deadlock.",
}
_SAVE_WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async"
_FORKED_MANAGER: list = []  # kept alive for the process: its server holds the queue


def _install_sync_save_queue() -> None:
    importlib.import_module(_SAVE_WRITER)._results_queue = queue.Queue()


def use_forked_save_queue() -> None:
    """Asynchronous saves: the writers' results cross from megatron's forked writer process."""
    if _FORKED_MANAGER:
        return
    manager = multiprocessing.get_context("fork").Manager()
    _FORKED_MANAGER.append(manager)
    importlib.import_module(_SAVE_WRITER)._results_queue = manager.Queue()


# --------------------------------------------------------------------------------------------
# The CPU compatibility layer. Each entry: what is patched, and why megatron-core needs it.
# --------------------------------------------------------------------------------------------

CPU_PATCHES: dict[str, str] = {
    "torch.cuda.current_device": "megatron allocates grad buffers, the global memory buffer and "
    "collective scratch tensors on torch.cuda.current_device() (~100 places); return 'cpu'",
    "torch.cuda.synchronize": "called around checkpoint saves and buffer frees; nothing to wait "
    "for",
    "torch.cuda.Stream/Event/stream/current_stream/default_stream": "DDP's communication stream "
    "and p2p/async-save events; on CPU every op is synchronous, so a stream is a no-op",
    "torch.Tensor.record_stream": "the combined 1F1B schedule (--overlap-moe-expert-parallel-"
    "comm) records its inputs on its compute and communication streams, which are the no-op "
    "streams above; nothing to record",
    "torch.cuda.nvtx.range/range_push/range_pop": "the same schedule names its steps with NVTX "
    "ranges, which a CPU build of torch refuses; profiler annotations, no-ops here",
    "torch.cuda.get_rng_state/set_rng_state/manual_seed": "the model-parallel RNG tracker forks "
    "the CUDA generator; on CPU the device generator is torch's CPU generator, so dropout forks "
    "work; data sampling therefore never uses torch's global generator",
    "megatron.core.tensor_parallel.random._get_cuda_rng_state/_set_cuda_rng_state": "same, for "
    "megatron's own copies of the CUDA RNG accessors",
    "torch.Tensor.cuda": "megatron calls .cuda() on tensors it already placed (optimizer state "
    "save, checkpoint load); on CPU the tensor is already where it belongs",
    "torch.Tensor.type": "the optimizers assert parameter type names 'torch.cuda.FloatTensor' / "
    "'torch.cuda.BFloat16Tensor'; the no-argument form reports the CUDA name for CPU tensors",
    "token_dispatcher.maybe_move_tensor_to_cpu": "the MoE all-to-all dispatcher converts its "
    "split sizes to numpy only when they sit on a GPU; gloo's all_to_all_single needs lists, "
    "so CPU tensors asked for as numpy are converted too",
    "device='cuda' factories in megatron modules": "grad scaler, optimizer found-inf flags, "
    "grad-norm clipping, schedules and the causal mask create tensors with device='cuda'; those "
    "modules see a torch whose factories map a CUDA device to the CPU (_CUDA_FACTORY_MODULES)",
    "pin_memory=True factories in megatron modules": "rotary embeddings under context "
    "parallelism stage an index in pinned memory, which fails without an accelerator; those "
    "modules (_PINNED_MEMORY_MODULES) see the same torch view, which drops pin_memory",
    "torch.device in megatron_fsdp.megatron_fsdp": "Megatron-FSDP compares its device with "
    "torch.device(f'cuda:{torch.cuda.current_device()}'), which is 'cuda:cpu' here; that "
    "module sees a torch.device that maps CUDA names to the CPU",
    "DeviceMesh in mcore_fsdp_adapter": "the Megatron-FSDP adapter builds its DTensor meshes "
    "with device_type='cuda'; on CPU they are built for 'cpu' (gloo)",
    "_coalescing_manager in megatron_fsdp.param_and_grad_buffer": "Megatron-FSDP prefetches "
    "parameter all-gathers asynchronously and orders them with CUDA streams and events, which "
    "are no-ops here, while gloo fills the buckets from its own threads; its coalesced "
    "collectives complete before the block returns, as every CPU op does (a CPU run hit one "
    "SIGSEGV in ~20 ZeRO-3 runs without this)",
}

# megatron-core modules whose source creates tensors with a hard-coded device="cuda".
_CUDA_FACTORY_MODULES = (
    "megatron.core.utils",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.rerun_state_machine",
    "megatron.core.tensor_parallel.data",
    "megatron.core.transformer.utils",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
)
# megatron-core modules that stage tensors in pinned memory, which needs an accelerator.
_PINNED_MEMORY_MODULES = ("megatron.core.models.common.embeddings.rope_utils",)
_FACTORIES = ("tensor", "zeros", "ones", "empty", "empty_like", "full", "arange")


class _NoOpStream:
    """Stands in for torch.cuda.Stream and torch.cuda.Event: CPU work is already ordered."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass

    def record_event(self, event: object = None) -> _NoOpStream:
        return _NoOpStream()

    def record(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: object) -> float:
        return 0.0


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _cpu_factory(factory):
    def make(*args, **kwargs):
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)  # needs an accelerator; CPU memory is already host
        return factory(*args, **kwargs)

    return make


def _torch_with_cpu_factories() -> types.ModuleType:
    """A view of `torch` whose tensor factories put device='cuda' tensors on the CPU."""
    view = types.ModuleType("torch")
    view.__dict__.update(torch.__dict__)
    for name in _FACTORIES:
        setattr(view, name, _cpu_factory(getattr(torch, name)))
    return view


_FSDP_MODULE = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp"
_FSDP_ADAPTER = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"
_FSDP_BUFFERS = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer"


def _synchronous(coalescing_manager):
    def manager(*args: object, **kwargs: object):
        kwargs["async_ops"] = False
        return coalescing_manager(*args, **kwargs)

    return manager


def _cpu_device(*args: object, **kwargs: object) -> torch.device:
    if (args and _is_cuda_device(args[0])) or str(kwargs.get("type", "")).startswith("cuda"):
        return torch.device("cpu")
    return torch.device(*args, **kwargs)


def _cpu_device_mesh(mesh_cls: type) -> type:
    class CpuDeviceMesh(mesh_cls):
        @staticmethod
        def from_group(*args: object, **kwargs: object):
            kwargs["device_type"] = "cpu"
            return mesh_cls.from_group(*args, **kwargs)

    return CpuDeviceMesh


def _cpu_rng_state(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, *args: object, **kwargs: object) -> None:
    torch.set_rng_state(new_state)


_real_tensor_type = torch.Tensor.type
# The originals, kept to tell whether the CPU patches are in place (`installed_cpu_patches`).
_REAL_CUDA = {name: getattr(torch.cuda, name) for name in
              ("current_device", "synchronize", "Stream", "Event", "stream", "current_stream",
               "default_stream", "get_rng_state", "set_rng_state", "manual_seed")}
_REAL_TENSOR_CUDA = torch.Tensor.cuda
_REAL_RECORD_STREAM = torch.Tensor.record_stream
_REAL_NVTX_RANGE = torch.cuda.nvtx.range
_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


def _tensor_type(self: torch.Tensor, dtype=None, non_blocking: bool = False, **kwargs):
    if dtype is None and not kwargs:
        name = _real_tensor_type(self)
        return _CUDA_TYPE_NAMES.get(name, name)
    return _real_tensor_type(self, dtype, non_blocking, **kwargs)


def installed_cpu_patches() -> list[str]:
    """The CPU patches found in place in this process (read from torch and megatron-core, not
    from a flag): all of them after `install()` without CUDA, none on a GPU."""
    found = [f"torch.cuda.{name}" for name, real in _REAL_CUDA.items()
             if getattr(torch.cuda, name) is not real]
    if torch.Tensor.cuda is not _REAL_TENSOR_CUDA:
        found.append("torch.Tensor.cuda")
    if torch.Tensor.type is not _real_tensor_type:
        found.append("torch.Tensor.type")
    if torch.Tensor.record_stream is not _REAL_RECORD_STREAM:
        found.append("torch.Tensor.record_stream")
    if torch.cuda.nvtx.range is not _REAL_NVTX_RANGE:
        found.append("torch.cuda.nvtx.range")
    found += [f"{name}.torch" for name in _CUDA_FACTORY_MODULES + _PINNED_MEMORY_MODULES
              if name in sys.modules and sys.modules[name].torch is not torch]
    return found


def _install_cpu_patches() -> None:
    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.synchronize = lambda device=None: None
    cuda.Stream = _NoOpStream
    cuda.Event = _NoOpStream
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.current_stream = lambda device=None: _NoOpStream()
    cuda.default_stream = lambda device=None: _NoOpStream()
    torch.Tensor.record_stream = lambda self, stream: None
    cuda.nvtx.range = lambda *args, **kwargs: contextlib.nullcontext()
    cuda.nvtx.range_push = lambda *args, **kwargs: None
    cuda.nvtx.range_pop = lambda *args, **kwargs: None
    cuda.get_rng_state = _cpu_rng_state
    cuda.set_rng_state = _set_cpu_rng_state
    cuda.manual_seed = torch.manual_seed
    cuda.random.get_rng_state = _cpu_rng_state
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.type = _tensor_type

    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random._get_cuda_rng_state = _cpu_rng_state
    random._set_cuda_rng_state = _set_cpu_rng_state
    # The tracker warns whenever the CPU generator moves inside a fork; on CPU the forked
    # generator *is* the CPU generator, so every dropout would warn.
    logging.getLogger(random.__name__).setLevel(logging.ERROR)

    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    to_cpu = dispatcher.maybe_move_tensor_to_cpu

    def split_sizes_to_cpu(tensor, as_numpy: bool = False, record_stream: bool = False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return to_cpu(tensor, as_numpy=as_numpy, record_stream=record_stream)

    dispatcher.maybe_move_tensor_to_cpu = split_sizes_to_cpu

    torch_view = _torch_with_cpu_factories()
    for module_name in _CUDA_FACTORY_MODULES + _PINNED_MEMORY_MODULES:
        importlib.import_module(module_name).torch = torch_view

    fsdp = importlib.import_module(_FSDP_MODULE)
    fsdp.torch = types.ModuleType("torch")
    fsdp.torch.__dict__.update(torch.__dict__)
    fsdp.torch.device = _cpu_device
    adapter = importlib.import_module(_FSDP_ADAPTER)
    adapter.DeviceMesh = _cpu_device_mesh(adapter.DeviceMesh)
    buffers = importlib.import_module(_FSDP_BUFFERS)
    buffers._coalescing_manager = _synchronous(buffers._coalescing_manager)


# --------------------------------------------------------------------------------------------
# Fixes for megatron-core 0.16.1 where it runs without Transformer Engine and Apex (every CPU
# run, and GPU runs without TE): its distributed optimizer's fallback to torch's Adam, and the
# MoE router. These are megatron bugs, not CPU quirks; without them a resume is silently wrong
# and MoE does not run.
# --------------------------------------------------------------------------------------------

NO_TE_FIXES: dict[str, str] = {
    "DistributedOptimizer.state_dict before the first step": "reads 'step' from the inner "
    "AdamW state, which torch creates lazily, and asserts on the empty state; loading a "
    "checkpoint builds that state dict first. We create AdamW's zero state up front.",
    "DistributedOptimizer.load_state_dict restores AdamW's 'step' wrongly": "it assigns one "
    "shared tensor to every parameter (torch's AdamW increments it in place once per "
    "parameter), and the dp_reshardable shard copy then overwrites it with 0, so after a "
    "resume Adam's bias correction restarts. Each parameter gets its own tensor holding the "
    "step saved in the optimizer's param groups.",
    "moe_utils.te_general_gemm undefined": "the MoE router's gating GEMM tests "
    "`te_general_gemm is not None`, but the name is only bound when TE imports: NameError on "
    "the first MoE forward. It is bound to None, selecting the torch GEMM path.",
    "DistributedOptimizer._set_main_param_and_optimizer_states outside no_grad": "copies the "
    "loaded fp32 weights in place into the main parameters, which for fp32 models are views of "
    "leaf parameters that require grad; autograd refuses. The copy runs under no_grad.",
}


def _init_adamw_state(optimizer: torch.optim.Optimizer) -> None:
    """The state torch's AdamW creates on its first step, created now."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param not in optimizer.state or not optimizer.state[param]:
                optimizer.state[param] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }


def _install_no_te_fixes() -> None:
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    distrib_optimizer = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    cls = distrib_optimizer.DistributedOptimizer
    original_state_dict, original_load_state_dict = cls.state_dict, cls.load_state_dict

    def state_dict(self):
        if isinstance(self.optimizer, torch.optim.Adam) and not self.optimizer.state:
            _init_adamw_state(self.optimizer)
        return original_state_dict(self)

    def load_state_dict(self, state_dict):
        original_load_state_dict(self, state_dict)
        if not isinstance(self.optimizer, torch.optim.Adam):
            return
        (step,) = {group["step"] for group in state_dict["optimizer"]["param_groups"]}
        for param_state in self.optimizer.state.values():
            param_state["step"] = torch.tensor(float(step), dtype=torch.float32)

    cls.state_dict = state_dict
    cls.load_state_dict = load_state_dict
    cls._set_main_param_and_optimizer_states = torch.no_grad()(
        cls._set_main_param_and_optimizer_states)
