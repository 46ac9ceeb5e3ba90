"""Start-up thresholds: the simulator's best (intra, inter) for the layout a run uses.

`--lgs-thresholds auto` asks this for the run's model, layout and hardware profile; the answer
is the online tuner's starting point. It is a prediction of the alpha-beta model (`timeline`),
not a measurement. Thresholds above the memory wall (`memwall`) are not recommended.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from megatron_lgs.lgs.costmodel import HardwareProfile
from megatron_lgs.lgs.grid import GRID_MB, preference, sweep
from megatron_lgs.lgs.hardware import resolve_profile
from megatron_lgs.lgs.timeline import MB, StepPrediction, Workload
from megatron_lgs.lgs.workload import Layout, ModelConfig, pipeline_split
from megatron_lgs.vocab_padding import padded_vocab_size

if TYPE_CHECKING:  # run_config imports this package for the --lgs flags: no import cycle
    from megatron_lgs.run_config import Config

# Without a GPU (CPU runs) or with one we have no profile for: the seed's cluster (A100, HDR).
DEFAULT_PROFILE = "a100-hdr"
_DEVICE_PROFILES = (("H200", "h200-ndr"), ("H100", "h100-ndr"), ("A100", "a100-hdr"))


def profile_for_device(device_name: str | None) -> str:
    """Profile for a CUDA device name (`torch.cuda.get_device_name()`); None means no GPU.

    Only the GPU is detected; the inter-node link is the one the profile pairs with it.
    """
    name = (device_name or "").upper()
    return next((prof for key, prof in _DEVICE_PROFILES if key in name), DEFAULT_PROFILE)


@dataclass(frozen=True)
class Recommendation:
    intra_mb: int
    inter_mb: int
    profile: str
    prediction: StepPrediction  # of the recommended thresholds
    fits_memory: bool  # False: even the smallest grid threshold is above the memory wall

    @property
    def thresholds(self) -> tuple[int, int]:
        return self.intra_mb, self.inter_mb


def recommend(w: Workload, grid_mb: list[int] = GRID_MB,
              inter_grid_mb: list[int] | None = None) -> Recommendation:
    """The fastest predicted grid point (`grid_mb` x `inter_grid_mb`, None: `grid_mb`) whose
    intra threshold fits under the memory wall.

    When none fits, the smallest intra threshold (the least staging memory) with its fastest
    inter threshold, flagged `fits_memory=False`. Ties go to the smaller thresholds.
    """
    r = sweep(w, grid_mb, inter_grid_mb)
    fitting = [p for p in r.predictions
               if p.thresholds.intra_bytes <= r.wall.largest_threshold_bytes]
    smallest = min(p.thresholds.intra_bytes for p in r.predictions)
    candidates = fitting or [p for p in r.predictions if p.thresholds.intra_bytes == smallest]
    best = min(candidates, key=preference)
    th = best.thresholds
    return Recommendation(th.intra_bytes // MB, th.inter_bytes // MB, w.hw.name, best,
                          bool(fitting))


def workload_for(
    *, num_layers: int, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
    vocab_size: int, seq_length: int, num_experts: int | None, moe_router_topk: int,
    tp: int, pp: int, dp: int, ep: int, gpus_per_node: int, micro_batch_size: int,
    num_micro_batches: int, profile: str | HardwareProfile | None = None,
    num_query_groups: int | None = None, kv_channels: int | None = None,
    swiglu: bool = False, moe_ffn_hidden_size: int | None = None, untie_embeddings: bool = True,
    etp: int | None = None, distributed_optimizer: bool = False, efficiency: float | None = None,
    weighting: str = "params",
) -> Workload:
    """The simulator's workload from trainer-level numbers (Megatron-LM flag names).

    `profile`: a name in `gpus.PROFILES`, a profile file (`hardware.load_profile`) or a
    profile; None means DEFAULT_PROFILE. `etp` None means the tensor-parallel size, as in
    megatron-core. `weighting`: `--lgs-layer-weighting`, how the engine closes its buckets.
    """
    model = ModelConfig(
        num_layers=num_layers, hidden=hidden_size, ffn_hidden=ffn_hidden_size,
        num_heads=num_attention_heads, vocab=vocab_size, seq_length=seq_length,
        num_query_groups=num_query_groups, kv_channels=kv_channels, swiglu=swiglu,
        num_experts=num_experts or 0,
        moe_topk=moe_router_topk if num_experts else ModelConfig.moe_topk,
        moe_ffn_hidden=moe_ffn_hidden_size, untie_embeddings=untie_embeddings)
    layout = Layout(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp or tp, gpus_per_node=gpus_per_node,
                    micro_batch_size=micro_batch_size, num_micro_batches=num_micro_batches,
                    distributed_optimizer=distributed_optimizer)
    return Workload(model, layout, resolve_profile(profile, DEFAULT_PROFILE), efficiency,
                    weighting)


def recommend_thresholds(**numbers: Any) -> Recommendation:
    """Best predicted (intra_mb, inter_mb) on the 8..256 MB x2 grid for a run.

    Keywords: those of `workload_for` (model numbers, layout, profile name).
    """
    return recommend(workload_for(**numbers))


def workload_for_config(cfg: Config, gpus_per_node: int,
                        profile: str | HardwareProfile | None = None,
                        efficiency: float | None = None) -> Workload:
    """`workload_for` with the numbers of a trainer `Config` (vocabulary padded as Megatron)."""
    m, par, t = cfg.model, cfg.parallel, cfg.training
    dp = par.data_parallel_size
    w = workload_for(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_size,
        num_attention_heads=m.num_attention_heads,
        vocab_size=padded_vocab_size(cfg.data.vocab_size, m.make_vocab_size_divisible_by,
                                     par.tensor_model_parallel_size),
        seq_length=m.seq_length, num_experts=m.num_experts, moe_router_topk=m.moe_router_topk,
        tp=par.tensor_model_parallel_size, pp=par.pipeline_model_parallel_size, dp=dp,
        ep=par.expert_model_parallel_size, etp=par.expert_tensor_parallel_size,
        gpus_per_node=gpus_per_node, micro_batch_size=t.micro_batch_size,
        num_micro_batches=t.global_batch_size // (t.micro_batch_size * dp), profile=profile,
        num_query_groups=m.query_groups, kv_channels=m.kv_channels, swiglu=m.swiglu,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size,
        untie_embeddings=m.untie_embeddings_and_output_weights,
        distributed_optimizer=cfg.optim.use_distributed_optimizer, efficiency=efficiency,
        weighting=cfg.lgs.lgs_layer_weighting)
    return replace(w, layout=replace(w.layout, **pipeline_split(par)))


def recommend_for_config(cfg: Config, gpus_per_node: int,
                         profile: str | HardwareProfile | None = None,
                         efficiency: float | None = None) -> Recommendation:
    """What `--lgs-thresholds auto` starts from for the run described by `cfg`."""
    return recommend(workload_for_config(cfg, gpus_per_node, profile, efficiency))
