"""NVIDIA's DGX Cloud Benchmarking recipes as rows of the validation table (`published_runs.py`):
NeMo 1 on H100 with every knob in the recipe's own files, each workload in BF16 and FP8 at
several GPU counts, its step time published per count (compared as tokens/s per GPU, the
global batch's tokens over that time, as the recipes' own tables turn it).

Which columns: each table's first and last GPU count. The columns between repeat the same work
a GPU at an intermediate data-parallel width (the global batch grows with the GPUs); the two
ends keep the smallest run and the largest one, where the data-parallel sync is widest. Chosen
before any was predicted. Grok-1 314B of the same release is left out: its layout table's DP
column does not multiply out to its GPU counts (TP4 PP8 CP2 DP4 on 2048 GPUs), and its figures
are marked "Dev"."""

from published_rows import GPT3, LLAMA, NEMOTRON

DGXC = ("NVIDIA/dgxc-benchmarking release v24.11.1 (commit 35a9aec, 2024-11), 'Expected "
        "Performance' of nemotron/README_15b.md, README_340b.md, llama3.1/README_8b.md, "
        "README_70b.md, README_405b.md and nemo_megatron/README_175b.md, with each folder's "
        "configure.sh or launch.sh and YAML of the same commit; H100, 'training step time', the "
        "last step of a 50-step run")
# NeMo 1's megatron_gpt_pretraining.py on megatron-core (`mcore_gpt: true`) with Transformer
# Engine: NeMo 24.09 containers for Nemotron-4 and Llama 3.1, 24.05 for GPT-3 175B. What every
# recipe sets: distributed_fused_adam (Apex's distributed Adam, ZeRO-1) with overlapped BF16
# gradient reduction and parameter gathers (`grad_sync_dtype: bf16`), FP8 with delayed scaling
# (`fp8_hybrid`) and FP8 parameters (`fp8_params`) in the FP8 runs, sequence parallelism and
# TE's TP communication overlap (`ub_tp_comm_overlap`) where tp > 1, pipeline sends overlapped with
# virtual stages (`overlap_p2p_comm`), no dropout but GPT-3's 0.1, vocabularies padded as
# Megatron pads them (a multiple of 128 x TP). The optimizer's state a parameter
# (`optimizer_state_bytes`, from NeMo 1's `megatron_base_model.py` of 2024-09 choosing Apex's
# `store_params`): the FP32 default beside BF16 weights keeps the main weights' low 16 bits
# (10 B), beside FP8 weights a whole FP32 copy (12 B); Nemotron-4 340B's `dtype: bf16` keeps
# BF16 moments and no copy (4 B), with FP8 weights a BF16 copy (6 B). The GPT-3 and
# Nemotron-4 340B recipes set NVTE_FUSED_ATTN=0 (TE's flash-attn backend, not cuDNN's), which
# the model does not tell apart: one fused-attention rate per GPU. The amax reduction of FP8's
# delayed scaling: every recipe exports NVTE_DP_AMAX_REDUCE_INTERVAL=0 and
# NVTE_ASYNC_AMAX_REDUCTION=1 (TP-only, asynchronous), which Transformer Engine read until its
# 1.6 (removed in 73f8d90fe, 2024-04-12); NeMo 24.09 runs TE 1.10 (NVIDIA's "Software Component
# Versions" page), so the Nemotron-4 and Llama 3.1 runs reduce over TP x DP x CP, blocking (NeMo
# 1's tp_only_amax_red default, which no recipe sets). NeMo 24.05 lists TE "1.6.0.dev0", and
# NeMo's CI image of that month (Dockerfile.ci at 526b6ade4b) pins TE bfe21c3d6 of 2024-04-07,
# before the removal: the GPT-3 175B runs taken as TP-only and asynchronous, as the variables
# asked (`async_amax_reduction`: waited for at the next FP8 module, not charged).
DGXC_MODELS = {
    # layers, hidden, ffn, heads, kv heads, vocab before padding, sequence, family
    "nemotron4-15b": (32, 6144, 24576, 48, 8, 256000, 4096, NEMOTRON),
    "nemotron4-340b": (96, 18432, 73728, 96, 8, 256000, 4096, NEMOTRON),
    "llama31-8b": (32, 4096, 14336, 32, 8, 128256, 8192, LLAMA),
    "llama31-70b": (80, 8192, 28672, 64, 8, 128256, 8192, LLAMA),
    # The 405B recipe runs GPT-2's BPE vocabulary on synthetic data and 16 query groups.
    "llama31-405b": (126, 16384, 53248, 128, 16, 50257, 8192, LLAMA),
    "gpt3-175b": (96, 12288, 49152, 96, 96, 50257, 2048, GPT3),
}
# Apex's gradient buckets, each YAML's `optim.bucket_cap_mb` (`dfa_bucket_cap_mb`).
DGXC_BUCKET_CAP_MB = {"nemotron4-15b": 100, "nemotron4-340b": 50, "llama31-8b": 75,
                      "llama31-70b": 75, "llama31-405b": 125, "gpt3-175b": 220}
DGXC_RUNS = [
    # model, GPUs, global batch, tp, pp, cp, vp, micro-batch, layers (proxy), recompute,
    # optimizer bytes (BF16 run, FP8 run), step s (BF16, FP8)
    ("nemotron4-15b", 16, 64, 4, 1, 1, 1, 4, None, "none", (10, 12), (2.83, 2.08)),
    ("nemotron4-15b", 2048, 8192, 4, 1, 1, 1, 4, None, "none", (10, 12), (2.96, 2.18)),
    ("nemotron4-340b", 128, 32, 8, 8, 1, 12, 1, None, "selective", (4, 6), (4.61, 3.16)),
    ("nemotron4-340b", 2048, 512, 8, 8, 1, 12, 1, None, "selective", (4, 6), (4.84, 3.49)),
    ("llama31-8b", 8, 128, 1, 1, 2, 1, 1, None, "none", (10, 12), (12.91, 9.67)),
    ("llama31-8b", 128, 2048, 1, 1, 2, 1, 1, None, "none", (10, 12), (13.10, 9.82)),
    ("llama31-70b", 64, 128, 4, 4, 2, 5, 1, None, "none", (10, 12), (14.72, 11.01)),
    ("llama31-70b", 2048, 4096, 4, 4, 2, 5, 1, None, "none", (10, 12), (14.98, 11.39)),
    # Below 576 GPUs the 405B recipe runs a proxy of fewer layers (configure.sh): on 32 GPUs 7
    # layers, PP1.
    ("llama31-405b", 32, 126, 8, 1, 2, 1, 1, 7, "none", (10, 12), (8.85, 5.80)),
    ("llama31-405b", 2304, 1008, 8, 9, 2, 7, 1, None, "none", (10, 12), (17.62, 12.35)),
    ("gpt3-175b", 128, 256, 4, 8, 1, 12, 1, None, "none", (10, 12), (8.91, 5.92)),
    ("gpt3-175b", 2048, 4096, 4, 8, 1, 12, 1, None, "none", (10, 12), (9.02, 6.24)),
]


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = 128 * tp
    return -(-vocab // multiple) * multiple


def dgxc_rows() -> list[dict]:
    rows = []
    for (model, gpus, batch, tp, pp, cp, vp, mbs, proxy_layers, recompute, state_bytes,
         seconds) in DGXC_RUNS:
        layers, hidden, ffn, heads, kv, vocab, seq, family = DGXC_MODELS[model]
        te_before_1_6 = model == "gpt3-175b"  # NeMo 24.05's TE read the NVTE_* variables
        for precision, state, step in zip(("bf16", "fp8"), state_bytes, seconds, strict=True):
            rows.append({
                "source": DGXC, "published": batch * seq / step / gpus,
                "metric": "tokens/s/GPU", "step_time_published_s": step,
                "run": {"id": f"dgxc-{model}-{precision}-{gpus}", "gpu": "h100-sxm",
                        "num_gpus": gpus, "num_layers": proxy_layers or layers,
                        "hidden": hidden, "ffn_hidden": ffn, "heads": heads, "kv_heads": kv,
                        "vocab": padded_vocab(vocab, tp), "seq_length": seq, **family,
                        "tp": tp, "pp": pp, "cp": cp, "vpp": vp, "micro_batch": mbs,
                        "global_batch": batch, "recompute": recompute,
                        "precision": precision, "fp8_params": True,
                        "distributed_optimizer": True, "optimizer_state_bytes": state,
                        "dfa_bucket_cap_mb": DGXC_BUCKET_CAP_MB[model],
                        "tp_comm_overlap": tp > 1, "grad_reduce_in_fp32": False,
                        "tp_only_amax_red": te_before_1_6,
                        "async_amax_reduction": te_before_1_6}})
    return rows
