"""GPU profiles: compute, memory and links per GPU type, for the whole-step model (`stepmodel`)
and the LGS threshold simulator alike.

`link_profile` turns a GPU profile and a NIC speed into the `costmodel.HardwareProfile` the
gradient-sync replay takes; `PROFILES` names the usual fabrics (`--lgs-hardware a100-hdr`).
A measured profile (`calibrate`) or a `costmodel.custom` one brings its own numbers instead.

Every constant is a data-sheet figure or a published microbenchmark, cited beside it; none is
fitted to a training run. Sources:
- [V100] NVIDIA Tesla V100 data sheet (SXM2 32 GB): 125 TFLOP/s FP16 tensor, 900 GB/s HBM2,
  NVLink 2 300 GB/s total (both directions); 80 SMs (Volta architecture whitepaper).
- [A100] NVIDIA A100 data sheet (SXM): 312 TFLOP/s BF16/FP16 dense, 1,555 GB/s (40 GB) and
  2,039 GB/s (80 GB) HBM, NVLink 3 600 GB/s total; 108 SMs (Ampere GA100 whitepaper).
- [H100] NVIDIA H100 data sheet (SXM): 989 TFLOP/s BF16 dense, 1,979 FP8 dense, 3.35 TB/s,
  NVLink 4 900 GB/s total; 132 SMs (Hopper whitepaper, H100 SXM5). H800 SXM: the same chip
  with NVLink cut to 400 GB/s total; H200: the same chip with HBM3e.
- [H200] NVIDIA H200 data sheet (SXM): H100's compute, 141 GB HBM3e at 4.8 TB/s.
- [MSMF] S. Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering, commit
  082816f of 2026-08-10, "faster mamf, plus msmf", on the branch `fast-mamf`, which master had not
  merged at 744d01e of 2026-08-22: master's table still has the bursts alone),
  compute/accelerator/README.md, MAMF & MSMF table, and benchmarks/README.md: the maximum
  *sustainable* matmul FLOP/s (MSMF), the rate a shape holds once the board sits at its power
  limit and the clock has settled ("the number that matches sustained training throughput"),
  against the maximum *achievable* burst at the boost clock (MAMF). H200 BF16 (torch 2.13, 700 W):
  MSMF 708.5 TFLOP/s (71.6% of 989) at ~1465 MHz, MAMF 841.9; all 8 GPUs of the node at once, 5
  rounds: MSMF mean 698.6, spread 4.5%. FP8 (e4m3): MSMF 1288.7 (65.1% of 1979). H100 SXM is the
  same chip at the same 700 W ("H200 is the same"); its table row has only the burst (MAMF 794.5,
  2.7.0+cu126). REFERENCE.md: ~790 TFLOP/s by matmuls on H200, a burst figure. Other copies of the
  author's material give other sustained H200 figures (755 in a later narration; 743-746, which
  this profile used until 2026-12-02, could not be found in any stored version): the ceiling is
  uncertain by about 5%.
- [HERE] A check of the Hopper constants, not a source of them: bench/measured/h200-2026-12-04/
  (`python bench/layer_kernels.py --rows hopper --ceiling-seconds 16`, one H200 at its 700 W
  limit, torch 2.11): 8192^3 BF16 for 8 s after 8 s of warm-up 666.4 TFLOP/s at 1455 MHz,
  where the curve below gives 676; FP8 1261.6; the 264 GEMMs of the 22 Hopper rows of
  bench/published_runs.py at their shapes took a median 0.988 of the curve's time (0.86-1.07).
- [POWER] H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable'
  Data!" (thonking.ai, 2024): A100 cuBLAS 8192^3 with randn inputs 257 TFLOP/s (82% of 312),
  with zeros 295: the chip is power-limited on random data. No sustained sweep of A100 is
  published; this is its sustained rate on the largest common shape (MAMF's burst: 268-271).
- [REF] /work/shared/REFERENCE.md "Typical links": NVLink a few us per hop, InfiniBand
  10-20 us; NCCL bus bandwidth H100 NVLink ~370 GB/s; HDR ~24 GB/s and NDR ~46-48 GB/s per NIC.
- [DSV3] DeepSeek-V3 technical report, sec. 3.2.1: H800 NVLink 160 GB/s, InfiniBand
  50 GB/s (400 Gb/s) per GPU.
- [FA2] T. Dao, FlashAttention-2 (2023), fig. 4-7: forward+backward reaches 50-73% of peak on
  A100 (head dim 128, causal, seq 2k-8k); [FA3] J. Shah et al., FlashAttention-3 (2024): FA2
  reaches ~35% of H100's peak, FA3 BF16 forward ~75%, backward ~55%.
- [LAUNCH] J. Huang Lin, "From PyTorch op to kernel launch" (GPU kernel serving, lesson 18):
  per-layer CPU costs of one eager op, ~5-25 us before the kernel runs.
- [NCCL689] S. Jeaugey (NCCL maintainer), NVIDIA/nccl issue #689 "Does NCCL Allreduce kernels
  slowdown the computation kernels of GPU?": NCCL launches the fewest CTAs that reach the
  platform's bandwidth, one per channel, "on DGX with 8 NICs ... it would use 16 SMs", and
  "NCCL CTAs won't share an SM with compute kernels". Lee et al., "Characterizing
  Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv
  2507.03114, 2025), measure the consequence: compute overlapped with communication runs 18.9%
  slower on average (A100, H100, MI250, MI210).
- [SPREAD] The same power-limited chips do not run at one rate. [MSMF]'s benchmarks/README.md,
  "alone vs all-8 concurrent": H200 BF16 on all 8 GPUs of a node at once, 5 rounds (n = 40),
  MSMF mean 698.6 TFLOP/s, range 4.5%, clocks 1405-1527 MHz ("a full-node training run will see
  something closer to the concurrent distribution"). P. Sinha et al., "Not All GPUs Are Created
  Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC22, arXiv
  2208.11035): across the GPUs of five production clusters, "8% (max 22%) average performance
  variation" for the same SKU, a spread of the same order over thousands of GPUs.
- [NVML] the memory a board has, as the driver reports it (nvidia-smi's total, MiB): the data
  sheets' "80 GB" and "141 GB" are rounded, nearer GiB than 1e9 bytes. thundergolfer.com/blog/
  nvidia-gpu-memory-capacity, "Why does an NVIDIA H100 80GB card offer 85.52 GB?" (Modal's
  table of NVML totals): H200 143,771 MiB, H100 80 GB 81,559, A100 80 GB 81,920, A100 40 GB
  40,960; V100 32 GB: 32,480 MiB in an nvidia-smi listing of four Tesla V100-PCIE-32GB
  (blog.cachecha.com/csdn/kunhe0512/126265050, a repost of an nvidia-smi walk-through; the SXM2
  board is taken as the same). H800: H100's 80 GB board, taken as H100's.
- [STREAM] achievable HBM bandwidth is ~85-90% of the data-sheet figure on A100/H100
  (NVIDIA's babelstream/STREAM results); we take 85% on every GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

from megatron_lgs.lgs.costmodel import GB, HardwareProfile, Link

NVLINK_ALPHA_S = 3e-6  # [REF] "a few us per hop"
IB_ALPHA_S = 15e-6  # [REF] 10-20 us per hop, midpoint
NIC_EFFICIENCY = 0.94  # [REF] HDR 200 Gb/s -> ~24 GB/s busbw (24 / 25), NDR 400 -> ~47 (47 / 50)
HBM_EFFICIENCY = 0.85  # [STREAM]
# GEMM efficiency falls as any dimension approaches the width of the GEMM kernels' tiles:
# eff(d) = d / (d + GEMM_HALF_DIM) per dimension, with GEMM_HALF_DIM the 128-wide threadblock
# tile of the BF16 kernels cuBLAS/CUTLASS pick on Ampere and Hopper (a dimension of one tile
# runs at half speed, 4096 at 97%); the same curve on every GPU. Its ceiling per profile is the
# best *sustained* matmul rate measured ([MSMF], [POWER]), not the burst: a training step is
# minutes of back-to-back GEMMs at the power limit.
GEMM_HALF_DIM = 128.0
# The sustained ceilings, rounded: Hopper BF16 708.5 / 989 and FP8 1288.7 / 1979 ([MSMF]),
# A100 257 / 312 ([POWER]; V100 borrows it).
HOPPER_BF16, HOPPER_FP8, AMPERE = 0.716, 0.651, 0.824
# Host time to issue one kernel from PyTorch eager (Python, autograd and ATen dispatch plus
# cudaLaunchKernel): [LAUNCH] puts the CPU side of one op at ~5-25 us, of which the driver's
# launch is ~1-3 us; we take 10 us. Not GPU-specific; it binds only where kernels are short.
HOST_S_PER_KERNEL = 10e-6
# Relative standard deviation of the sustained tensor-core rate across GPUs running at once
# ([SPREAD]: a range of 4.5% over 40 concurrent samples is 1.04 sigma-units of 4.32, the
# expected range of 40 normal draws). Taken for every GPU type, as a normal distribution.
CLOCK_SPREAD = 0.01
# SMs an NCCL collective holds while it runs beside compute ([NCCL689], the DGX figure; taken
# for every GPU and every collective group): the compute beside it runs on the rest.
NCCL_COMM_SMS = 16


def _mib(total_mib: int) -> float:
    """A board's memory as the driver reports it ([NVML]), in GB of 1e9 bytes."""
    return total_mib * 2**20 / 1e9


@dataclass(frozen=True)
class GpuProfile:
    """One GPU type and the fabric it usually ships in."""

    name: str
    peak_tflops: float  # dense BF16 (FP16 on V100): the MFU denominator
    fp8_tflops: float | None  # dense FP8; None: no FP8 tensor cores
    gemm_max_efficiency: float  # sustained large-GEMM fraction of peak [MSMF][POWER]
    attention_efficiency: float  # fused (flash) attention fwd+bwd fraction of peak [FA2][FA3]
    memory_gb: float  # the board's total as the driver reports it [NVML], 1e9 bytes
    hbm_gbps: float  # data-sheet HBM bandwidth, GB/s
    nvlink_busbw_gbps: float  # NCCL bus bandwidth inside a node, GB/s
    nic_gbit_per_gpu: float  # the usual inter-node fabric, Gb/s per GPU
    sm_count: int  # streaming multiprocessors [V100][A100][H100]
    bf16: bool = True
    fp8_max_efficiency: float | None = None  # sustained FP8 fraction of fp8_tflops [MSMF]

    def gemm_tflops(self, precision: str) -> float:
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.peak_tflops

    def gemm_ceiling(self, precision: str) -> float:
        """Sustained large-GEMM fraction of `gemm_tflops(precision)`."""
        if precision == "fp8" and self.fp8_max_efficiency:
            return self.fp8_max_efficiency
        return self.gemm_max_efficiency


GPUS: dict[str, GpuProfile] = {
    # V100: no BF16 (FP16 only); no published matmul sweep we could cite, so A100's sustained
    # 82% (an assumption; the Megatron-LM README's four DGX-2 runs of 2020-09 read -1.2% ..
    # +10.2% with it, bench/published_runs.py). FlashAttention does not run on Volta (runs
    # default to unfused attention); its 40% applies only to a run that sets flash_attention
    # true, and is an assumption too.
    # DGX-1/DGX-2 carry 100 Gb/s EDR per two GPUs; NVLink 2 busbw taken as 0.8 x its 150 GB/s
    # per direction, the ratio H100 shows ([REF] 370 of 450) and H800 ([DSV3] 160 of 200).
    "v100-32gb": GpuProfile("v100-32gb", 125.0, None, AMPERE, 0.40, _mib(32480), 900.0, 120.0,
                            50.0, 80, bf16=False),
    # A100: NVLink 3 busbw 0.8 x 300 GB/s per direction; DGX A100 has one HDR 200 Gb/s per GPU.
    "a100-40gb": GpuProfile("a100-40gb", 312.0, None, AMPERE, 0.60, _mib(40960), 1555.0, 240.0,
                            200.0, 108),
    "a100-80gb": GpuProfile("a100-80gb", 312.0, None, AMPERE, 0.60, _mib(81920), 2039.0, 240.0,
                            200.0, 108),
    # H100 / H200: NDR 400 Gb/s per GPU (DGX H100/H200); cuDNN fused attention between FA2 and
    # FA3 ([FA3]: 35% and ~65% fwd+bwd), so 50%.
    "h100-sxm": GpuProfile("h100-sxm", 989.0, 1979.0, HOPPER_BF16, 0.50, _mib(81559), 3350.0,
                           370.0, 400.0, 132, fp8_max_efficiency=HOPPER_FP8),
    "h800": GpuProfile("h800", 989.0, 1979.0, HOPPER_BF16, 0.50, _mib(81559), 3350.0, 160.0,
                       400.0, 132, fp8_max_efficiency=HOPPER_FP8),
    "h200": GpuProfile("h200", 989.0, 1979.0, HOPPER_BF16, 0.50, _mib(143771), 4800.0, 370.0,
                       400.0, 132, fp8_max_efficiency=HOPPER_FP8),
}


def get_gpu(name: str) -> GpuProfile:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown gpu {name!r}; known: {sorted(GPUS)}") from None


@lru_cache(maxsize=256)  # the planner asks for the same few (GPU, N) thousands of times
def slowest_gpu(gpu: GpuProfile, num_gpus: int) -> GpuProfile:
    """`gpu` as the slowest of `num_gpus` that step together.

    A synchronous step waits at every collective for its slowest rank, so a job computes at
    the pace of its slowest GPU ([SPREAD]): the expected largest of `num_gpus` standard normal
    draws (Blom's approximation), times `CLOCK_SPREAD`, comes off the tensor-core ceilings
    (GEMMs and fused attention). Memory-bound work runs at the HBM's clock and keeps its rate.
    One GPU is its own slowest.
    """
    if num_gpus <= 1:
        return gpu
    z = NormalDist().inv_cdf((num_gpus - 0.375) / (num_gpus + 0.25))
    keep = 1.0 - CLOCK_SPREAD * z
    fp8 = gpu.fp8_max_efficiency
    return replace(gpu, gemm_max_efficiency=gpu.gemm_max_efficiency * keep,
                   attention_efficiency=gpu.attention_efficiency * keep,
                   fp8_max_efficiency=fp8 * keep if fp8 else fp8)


def inter_bandwidth_Bps(nic_gbit_per_gpu: float) -> float:
    """NCCL bus bandwidth across nodes per GPU, from its NIC's line rate."""
    return nic_gbit_per_gpu / 8 * GB * NIC_EFFICIENCY


def link_profile(gpu: GpuProfile, gpus_per_node: int = 8, nic_gbit_per_gpu: float | None = None,
                 name: str | None = None) -> HardwareProfile:
    """The two-level link profile the gradient-sync replay (`timeline`) uses; its compute is
    timed by `gpu`'s kernel model."""
    nic = gpu.nic_gbit_per_gpu if nic_gbit_per_gpu is None else nic_gbit_per_gpu
    return HardwareProfile(
        name=name or f"{gpu.name}/{nic:g}Gb",
        intra=Link(NVLINK_ALPHA_S, gpu.nvlink_busbw_gbps * GB),
        inter=Link(IB_ALPHA_S, inter_bandwidth_Bps(nic)),
        gpus_per_node=gpus_per_node,
        peak_flops=gpu.peak_tflops * 1e12,
        memory_bytes=gpu.memory_gb * GB,
        source="megatron_lgs/lgs/gpus.py (data sheets, [MSMF], [POWER], [REF], [DSV3], [NCCL689])",
        # The backward beside a reduction runs on the SMs NCCL's CTAs leave it.
        overlap=1.0 - NCCL_COMM_SMS / gpu.sm_count,
        gpu=gpu.name,
    )


# The built-in fabrics: DGX A100 (HDR 200 Gb/s per GPU), DGX H100 and H200 (NDR 400 Gb/s).
PROFILES: dict[str, HardwareProfile] = {
    name: link_profile(GPUS[gpu], name=name)
    for name, gpu in (("a100-hdr", "a100-80gb"), ("h100-ndr", "h100-sxm"), ("h200-ndr", "h200"))
}


def get_profile(name: str) -> HardwareProfile:
    """A named profile; a clear error lists the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown hardware profile {name!r}; known: {sorted(PROFILES)}") from None
