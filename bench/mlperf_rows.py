"""MLPerf Training's H100 and H200 rows of the validation table (`published_runs.py`): GPT-3 175B
of rounds 3.1-4.1 and Llama 3.1 of rounds 5.0-5.1, their step times read from the submitters'
logs by `mlperf_steps.py`, their layouts and knobs from each submission's configs.

The step time is the median of the times the trainer logged for each of its steps (NeMo's
`tracked_stats`), the steady step the model predicts and the statistic the other sources
publish (a median or a steady-state average); round 4.0's NVIDIA logs carry no per-step times,
so its three rows take the median over timed blocks (a block's duration over its steps), which
also counts the return from each evaluation and the slow steps: 8.7% more than the trainer's
median on Oracle's 3072 GPUs and on Cisco's 128, 0.1-3.4% on the other systems that log both.
Until 2026-12-06 every row took the blocks' figure."""

from published_rows import GPT3, LLAMA

MLPERF = ("MLCommons MLPerf Training, GPT-3 175B on H100, rounds 3.1 (2023-11), 4.0 (2024-06) and "
          "4.1 (2024-11): mlcommons/training_results_v3.1 (commit d06288b2bd), _v4.0 "
          "(6fe954378e) and _v4.1 (b87b9e396f), every H100 system's "
          "results/<system>/gpt3/result_*.txt with the configs of its benchmarks/gpt3 folder; "
          "tokens/s/GPU from the step time: the median of the trainer's per-step times of all "
          "runs (tracked_stats; round 4.0's NVIDIA logs have none: each timed block's MLLOG "
          "duration over its steps, the median of all blocks; bench/mlperf_steps.py)")
# NVIDIA's NeMo implementation as every one of these submitters ran it (NeMo 23.09 in 3.1,
# 24.04 in 4.0, 24.09 in 4.1; conf/custom.yaml and config_common.sh of each folder): the
# MLPerf GPT-3 175B (96 layers, hidden 12288, 96 heads, GeLU MLP 4h, learned positions, tied
# embeddings, sequence 2048, no dropout), its SentencePiece vocabulary of 50257 padded as
# Megatron pads (a multiple of 128 x TP: 50688 at TP4), TP4 with sequence parallelism and TE's
# userbuffer TP overlap, FP8 with delayed scaling (hybrid), no recompute, distributed Adam
# with overlapped BF16 gradient reduction and parameter gathers, pipeline sends overlapped.
# Virtual stages: INTERLEAVED_PIPELINE of the system's config, else custom.yaml's default 12;
# FP8 parameters (FP8_PARAMS) from 4.0 on. The log's gradient_accumulation_steps checks each
# micro-batch size. Round 4.1's n1452 is round 4.0's run resubmitted (same folder, same
# blocks): counted once. Round 3.0's logs time the whole run as one block: no step time.
# Network: 400 Gb/s per GPU on every system (DGX H100 with 8 NDR NICs; Azure ND H100 v5 and
# OCI BM.GPU.H100.8 are built the same; Supermicro's log leaves its network blank).
# The amax reduction of FP8's delayed scaling (`tp_only_amax_red`): round 3.1's config_common.sh
# exports NVTE_DP_AMAX_REDUCE_INTERVAL=0 and NVTE_ASYNC_AMAX_REDUCTION=1, which its Transformer
# Engine (TE_REVISION of October 2023) reads: TP only, asynchronous (waited for at the next FP8
# module, `async_amax_reduction`, not charged). Round 4.0 exports the same, but its TE
# (v1.6rc1, 9e4091e7) no longer reads them (removed in 73f8d90fe) and its custom.yaml has no
# tp_only_amax_red, NeMo 1's default being false: TP x DP, blocking. Round 4.1's custom.yaml sets
# tp_only_amax_red (default True); Oracle's folder is NVIDIA's 24.09 implementation (the same
# Dockerfile but for the base image's registry, the same callbacks and config_common.sh but for
# SHARP and its cluster's settings) without its conf/: taken with NVIDIA's custom.yaml.
# Apex's gradient buckets (`dfa_bucket_cap_mb`): conf/optim/distributed_fused_adam.yaml's
# bucket_cap_mb, 100 by default (round 3.1: no config sets BUCKET_CAP_MB), 200 from config_common.sh
# in rounds 4.0 and 4.1 (Supermicro's and Oracle's logs print it), 125 in NVIDIA's 4.1 config
# for 32 nodes (config_DGXH100_32x8x256x4x8_mbs2.sh, after config_common.sh).
MLPERF_BUCKET_CAP_MB = {"3.1": 100, "4.0": 200, "4.1": 200, "NVIDIA/eos_n32_ngc24.09_nemo": 125}
MLPERF_GPT3 = {"gpu": "h100-sxm", "num_layers": 96, "hidden": 12288, "heads": 96, "tp": 4,
               "vocab": 50688, "seq_length": 2048, **GPT3, "dropout": 0.0, "precision": "fp8",
               "distributed_optimizer": True, "tp_comm_overlap": True,
               "grad_reduce_in_fp32": False}
MLPERF_RUNS = [
    # round, submitter/system, GPUs, global batch, pp, vp, micro-batch, FP8 params, step s
    # (the trainer's median; round 4.0's NVIDIA rows: the blocks')
    ("3.1", "NVIDIA/eos_n64_ngc23.09_nemo", 512, 2048, 8, 12, 1, False, 11.0520),
    ("3.1", "NVIDIA/eos_n96_ngc23.09_nemo", 768, 3072, 8, 12, 1, False, 11.0751),
    ("3.1", "NVIDIA/eos-dfw_n512_ngc23.09_nemo", 4096, 2048, 8, 12, 1, False, 1.6088),
    ("3.1", "NVIDIA/eos-dfw_n768_ngc23.09_nemo", 6144, 3072, 8, 12, 1, False, 1.6153),
    ("3.1", "NVIDIA/eos-dfw_n1024_ngc23.09_nemo", 8192, 4096, 8, 12, 1, False, 1.6193),
    ("3.1", "NVIDIA/eos-dfw_n1280_ngc23.09_nemo", 10240, 2560, 8, 12, 1, False, 0.9256),
    ("3.1", "NVIDIA/eos-dfw_n1344_ngc23.09_nemo", 10752, 2688, 8, 12, 1, False, 0.9296),
    ("3.1", "Azure+NVIDIA/ND_H100_v5_n1344_pytorch", 10752, 2688, 8, 12, 1, False, 0.9473),
    ("4.0", "NVIDIA/eos_n64_ngc24.04_nemo", 512, 2304, 8, 4, 2, True, 10.9800),
    ("4.0", "NVIDIA/eos-dfw_n1344_ngc24.04_nemo", 10752, 2688, 6, 8, 1, True, 0.9207),
    ("4.0", "NVIDIA/eos-dfw_n1452_ngc24.04_nemo", 11616, 2904, 6, 8, 1, True, 0.9217),
    ("4.0", "smc/64xSMC-H100-SXM-80GB", 512, 2048, 8, 12, 2, True, 10.6355),
    ("4.1", "NVIDIA/eos_n32_ngc24.09_nemo", 256, 2048, 8, 6, 2, True, 18.3779),
    ("4.1", "NVIDIA/eos_n64_ngc24.09_nemo", 512, 2048, 8, 6, 2, True, 9.5004),
    ("4.1", "Oracle/1536xBM.GPU.H100.8", 1536, 3072, 8, 4, 2, True, 5.1667),
    ("4.1", "Oracle/3072xBM.GPU.H100.8", 3072, 3072, 8, 4, 2, True, 3.0643),
]


def mlperf_rows() -> list[dict]:
    """Compared in tokens per second per GPU, as the other H100 rows, from the step time."""
    seq = MLPERF_GPT3["seq_length"]
    return [{"source": MLPERF, "published": batch * seq / step / gpus, "metric": "tokens/s/GPU",
             "system": f"MLPerf {rnd} {system}",
             "run": {**MLPERF_GPT3, "id": f"mlperf{rnd.replace('.', '')}-"
                     f"{system.split('/')[0].split('+')[0].lower()}-{gpus}",
                     "num_gpus": gpus, "pp": pp, "vpp": vp, "micro_batch": mbs,
                     "global_batch": batch, "fp8_params": fp8_params,
                     "dfa_bucket_cap_mb": MLPERF_BUCKET_CAP_MB.get(system,
                                                                   MLPERF_BUCKET_CAP_MB[rnd]),
                     "tp_only_amax_red": rnd != "4.0", "async_amax_reduction": rnd == "3.1"}}
            for rnd, system, gpus, batch, pp, vp, mbs, fp8_params, step in MLPERF_RUNS]


MLPERF_LLAMA = ("MLCommons MLPerf Training, Llama 3.1 pretraining on H100 and H200: 405B in "
                "round 5.0 (2025-06), mlcommons/training_results_v5.0 (commit 0fdc28f013), and "
                "8B in round 5.1 (2025-11), _v5.1 (441d65f444), every H100 and H200 system's "
                "results/<system>/llama31_*/result_*.txt with the configs of its benchmarks "
                "folder; tokens/s/GPU from the step time: the median of the trainer's per-step "
                "times of all runs (tracked_stats; bench/mlperf_steps.py)")
# NVIDIA's NeMo implementation as each submitter ran it (NeMo 25.01 for the 405B; the 25.08-25.09
# containers for the 8B; pretrain.py, conf/custom.yaml, config_common*.sh and the system's
# config_*.sh of each folder): NeMo's Llama 3.1 8B and 405B (Llama31Config8B / 405B: SwiGLU, 8 KV
# heads, RoPE, untied embeddings, no dropout), vocabulary 128256, sequence 8192, micro-batch 1, the
# log's gradient_accumulation_steps micro-batches a step; TP with sequence parallelism and TE's
# userbuffer TP overlap, FP8 (delayed scaling unless the config sets FP8_RECIPE tensorwise, TE's
# current scaling), FP8 weights, no recompute, distributed optimizer with overlapped BF16 gradient
# reduction (pretrain.py: grad_reduce_in_fp32 False) and parameter gathers, pipeline sends
# overlapped, the amax reduction over TP only (custom.yaml's tp_only_amax_red, default True, in
# every folder), megatron-core DDP buckets of custom.yaml's `bucket_size` (BUCKET_SIZE, which no
# config sets: 200 parameters in the 405B folders and 64 in Cisco's, a bucket per weight tensor;
# 134217728 in HPE's; Cisco's configs export BUCKET_CAP_MB=125, which its pretrain.py does not
# read). The 405B: PP8 CP2, 8 virtual stages, the embedding and the loss counted as pipeline
# layers (ASYM_PP_EMBED, ASYM_PP_LOSS). Network: 400 Gb/s per GPU (DGX H100's and Nebius's 8 NDR
# NICs; Cisco's 8 ConnectX-7 400 Gb/s Ethernet; HPE's description gives no speed). Not in the model:
# HPE's 8B runs attention in FP8 (FP8_DPA) under full-step CUDA graphs (config_common_fp8attn.sh,
# config_common_cg.sh); the model runs it in BF16. Round 5.1's Nebius H200 405B systems are round
# 5.0's runs resubmitted (the same blocks): counted once.
MLPERF_LLAMA31 = {"vocab": 128256, "seq_length": 8192, "kv_heads": 8, **LLAMA,
                  "precision": "fp8", "fp8_recipe": "delayed", "fp8_params": True,
                  "tp_only_amax_red": True, "distributed_optimizer": True,
                  "tp_comm_overlap": True,
                  "grad_reduce_in_fp32": False, "micro_batch": 1}
MLPERF_LLAMA_MODELS = {
    "405b": {"num_layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128, "pp": 8,
             "vpp": 8, "cp": 2, "account_for_embedding_in_pipeline_split": True,
             "account_for_loss_in_pipeline_split": True, "ddp_bucket_size": 200},
    "8b": {"num_layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32, "pp": 1},
}
MLPERF_LLAMA_RUNS = [
    # round, submitter/system, model, GPU, GPUs, global batch, layout over the model's, step s
    # (the trainer's median)
    ("5.0", "NVIDIA/eos-dfw_n64_ngc25.01_nemo", "405b", "h100-sxm", 512, 1152, {"tp": 8}, 55.1338),
    ("5.0", "NVIDIA/eos-dfw_n256_ngc25.01_nemo", "405b", "h100-sxm", 2048, 1152, {"tp": 8},
     14.2202),
    ("5.0", "NVIDIA/eos-dfw_n304_ngc25.01_nemo", "405b", "h100-sxm", 2432, 1216, {"tp": 8},
     12.7287),
    ("5.0", "NVIDIA/eos-dfw_n320_ngc25.01_nemo", "405b", "h100-sxm", 2560, 1120, {"tp": 8},
     11.1742),
    ("5.0", "NVIDIA/eos-dfw_n1024_ngc25.01_nemo", "405b", "h100-sxm", 8192, 1536, {"tp": 8},
     5.1801),
    ("5.0", "Nebius/nebius_soperator_8xH200_n64_ngc25.01_nemo", "405b", "h200", 512, 1152,
     {"tp": 4}, 50.0160),
    ("5.0", "Nebius/nebius_soperator_8xH200_n128_ngc25.01_nemo", "405b", "h200", 1024, 1152,
     {"tp": 4}, 25.3564),
    ("5.1", "Cisco/hpf_n8", "8b", "h100-sxm", 64, 64, {"tp": 1, "ddp_bucket_size": 64},
     0.7205),
    ("5.1", "Cisco/hpf_n16", "8b", "h100-sxm", 128, 64, {"tp": 2, "ddp_bucket_size": 64},
     0.4850),
    ("5.1", "HPE/HPE-Cray-XD670-H200-SXM5-141GB_n8_25.09", "8b", "h200", 64, 32,
     {"tp": 1, "cp": 2, "fp8_recipe": "current", "tp_comm_overlap": False,
      "ddp_bucket_size": 134217728}, 0.3531),
]


def mlperf_llama_rows() -> list[dict]:
    """Tokens per second per GPU from the step time, as `mlperf_rows`."""
    seq = MLPERF_LLAMA31["seq_length"]
    return [{"source": MLPERF_LLAMA, "published": batch * seq / step / gpus,
             "metric": "tokens/s/GPU", "system": f"MLPerf {rnd} {system}",
             "run": {**MLPERF_LLAMA31, **MLPERF_LLAMA_MODELS[model], **layout, "gpu": gpu,
                     "id": f"mlperf{rnd.replace('.', '')}-{system.split('/')[0].lower()}-"
                           f"{model}-{gpus}",
                     "num_gpus": gpus, "global_batch": batch}}
            for rnd, system, model, gpu, gpus, batch, layout, step in MLPERF_LLAMA_RUNS]


# One release at one layout across scales: `published_runs.per_micro_batch_fit`'s rows, by a
# regular expression their ids match. NVIDIA's 405B twice: all five rows, and the two at
# Nebius's scale (512-2048 GPUs), which set the H200 rows beside the H100 ones.
MLPERF_FITS = {"mlperf31-nvidia-": "MLPerf 3.1 GPT-3 175B rows of NVIDIA",
               "mlperf50-nvidia-405b-": "MLPerf 5.0 Llama 3.1 405B rows of NVIDIA",
               r"mlperf50-nvidia-405b-(512|2048)$": "MLPerf 5.0 Llama 3.1 405B rows of NVIDIA "
                                                    "at Nebius's scale",
               "mlperf50-nebius-405b-": "MLPerf 5.0 Llama 3.1 405B rows of Nebius on H200"}
