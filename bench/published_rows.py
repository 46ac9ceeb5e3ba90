"""Training runs published with their layout and throughput, each with its source: the rows of
`published_runs.py`'s table and the runs it prints outside it. Data only; the sources' software
of the time is stated beside each, as the model's inputs take it.
"""

from __future__ import annotations

from moe_rows import QWEN3_235B_RUN

NARAYANAN = ("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU "
             "Clusters Using Megatron-LM' (SC21, arXiv 2104.04473), Table 1; same rows in "
             "Megatron-LM's README of 2021 (images/cases_april2021.png)")
NARAYANAN_SCRIPT = ("Megatron-LM examples/academic_paper_scripts/sc21/run_table_1.sh and "
                    "CONFIG.sh (the authors' launch script for Table 1)")
# Megatron-LM of April 2021 as that script runs it: FP16 (--fp16), full uniform recompute,
# unfused attention (no FlashAttention yet), no sequence parallelism or distributed optimizer,
# gradients in param.grad (no contiguous buffer or fused accumulation yet: `grad_buffer`
# false), blocking pipeline sends (`batch_isend_irecv` then wait, no overlap option yet) of
# 1 / tp slices all-gathered after receipt (--scatter-gather-tensors-in-pipeline, default on),
# output layer tied to the word embeddings (untying came to Megatron-LM in December 2022),
# TP all-reduces blocking in autograd both ways (`tp_async_backward` false),
# sequence 2048; micro-batch size and layers per virtual stage from the script; --DDP-impl
# torch (PyTorch DDP, all-reduce overlapped with the last micro-batch's backward in its
# default 25 MB buckets) for the rows without PP, local (all-reduce after the backward) for
# the others. 8 x 80 GB A100 per
# node with 8 HDR NICs (Selene).
TORCH_DDP_BUCKET_MB = 25  # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)
NARAYANAN_RUNS = [
    # name, heads, hidden, layers, tp, pp, gpus, batch, TFLOP/s per GPU (recompute counted),
    # micro-batch, virtual stages, torch DDP
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1, True),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1, True),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1, True),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1, True),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1, False),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3, False),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2, False),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2, False),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3, False),
    ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1, False),
]

MEGATRON_H100 = ("Megatron-LM README, 'Training Speed and Scalability' (Megatron-Core r0.8.0, "
                 "H100, weak scaling; images/model_table.png, commit f2e5db402c of 2024-07)")
# BF16 with Transformer Engine (fused attention), sequence parallelism, distributed optimizer,
# --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap (all stated in the README),
# no recompute, vocabulary 131072, sequence 4096, GPT with a 4h GeLU MLP (the parameter counts
# match). Micro-batch size and virtual stages are not published: each row takes the fastest
# combination the model predicts that fits memory (the layout its authors tuned), micro-batch
# 1, 2, 4 or 8 and any virtual-stage count that divides the layers; both printed in the row.
# The README says pipeline communication was overlapped, which r0.8 does only with virtual
# stages: for the 119B (23 layers a stage) and the 462B (7) that leaves one layer per chunk.
MEGATRON_H100_RUNS = [
    # name, heads, hidden, layers, tp, pp, gpus, batch, TFLOP/s per GPU (model FLOPs)
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]


KORTHIKANTI = ("Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer "
               "Models' (MLSys 2023, arXiv 2205.05198), Table 5 (iteration time) with the "
               "layouts of its Table 3")
KORTHIKANTI_LAYOUT = ("Table 3 of the paper; micro-batch sizes and virtual stages as Calculon "
                      "(calculon-ai/calculon, validation/seqsel/tab5/*.json) reads them")
# Megatron-LM at the merge of sequence parallelism (d898a8991d, 2022-05-25), as those runs
# used it: FP16 (Calculon's inputs), data parallelism 1 (the paper: 'measured using a data
# parallel size of one'), unfused attention (masked-softmax fusion), tied embeddings, blocking
# pipeline sends (`batch_isend_irecv` then `torch.cuda.synchronize`), scatter-gather of those
# sends on unless sequence parallel (`p2p_communication.py`), the TP all-reduce / all-gather
# and reduce-scatter of the column-parallel backward asynchronous beside the GEMMs
# (`LinearWithGradAccumulationAndAsyncCommunication`, `--async-tensor-model-parallel-
# allreduce` on by default), FP16 gradients added into an FP16 buffer by the backward hooks
# and cast to FP32 main grads by the optimizer (no fused accumulation without FP32
# accumulation: `grad_buffer` false). 'full': full recompute, no sequence parallelism;
# 'seqsel': sequence parallelism and selective recompute. 8 x 80 GB A100 per node (Selene).
KORTHIKANTI_RUNS = [
    # name, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, virtual stages,
    # iteration seconds (full, seqsel)
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, (1.42, 1.10)),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, (18.13, 13.75)),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, (49.05, 37.83)),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, (94.42, 71.49)),
]


# What Megatron-LM of 2021-2022 on Selene shares between those two sources: GPT-2's vocabulary,
# sequence 2048, FP16, unfused attention, no distributed optimizer, FP16 gradients outside a
# fused buffer, blocking pipeline sends with scatter-gather, tied embeddings.
MEGATRON_LM_A100 = {
    "gpu": "a100-80gb", "vocab": 51200, "seq_length": 2048, "precision": "fp16",
    "flash_attention": False, "distributed_optimizer": False, "grad_buffer": False,
    "overlap_p2p_comm": False, "p2p_scatter_gather": True, "untie_embeddings": False}


def korthikanti_rows() -> list[dict]:
    rows = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, mbs, vpp, times in KORTHIKANTI_RUNS:
        for mode, seconds in zip(("full", "seqsel"), times, strict=True):
            rows.append({
                "source": KORTHIKANTI, "published": seconds, "metric": "iteration time s",
                "layout_source": KORTHIKANTI_LAYOUT,
                "run": {**MEGATRON_LM_A100, "id": f"korthikanti22-{name}-{mode}",
                        "num_gpus": gpus, "num_layers": layers, "hidden": hidden,
                        "heads": heads, "tp": tp, "pp": pp, "dp": 1, "vpp": vpp,
                        "micro_batch": mbs, "global_batch": batch,
                        "recompute": "full" if mode == "full" else "selective",
                        "sequence_parallel": mode == "seqsel", "overlap_grad_reduce": False,
                        "tp_async_backward": True}})
    return rows


def narayanan_rows() -> list[dict]:
    rows = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops, mbs, vpp, torch_ddp in \
            NARAYANAN_RUNS:
        rows.append({
            "source": NARAYANAN, "published": tflops, "metric": "TFLOP/s/GPU (with recompute)",
            "layout_source": NARAYANAN_SCRIPT,
            "bucket_mb": TORCH_DDP_BUCKET_MB if torch_ddp else None,
            "run": {**MEGATRON_LM_A100, "id": f"narayanan21-{name}", "num_gpus": gpus,
                    "num_layers": layers, "hidden": hidden, "heads": heads, "tp": tp,
                    "pp": pp, "vpp": vpp, "micro_batch": mbs, "global_batch": batch,
                    "recompute": "full", "sequence_parallel": False,
                    "overlap_grad_reduce": torch_ddp, "tp_async_backward": False}})
    return rows


MEGATRON_GPT3_2021 = ("Megatron-LM README, 'GPT-3 Example' (since commit 152aab304d of "
                      "2021-01-11, unchanged at f2e5db402c): GPT-3 175B on 1024 A100, 'each "
                      "iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU'")
MEGATRON_GPT3_2021_SCRIPT = ("Megatron-LM examples/pretrain_gpt3_175B.sh at 152aab304d (the "
                             "README's script for that figure)")


def megatron_gpt3_2021_rows() -> list[dict]:
    """GPT-3 175B as the README's script runs it: TP8 PP16 on 128 nodes (DP 8), micro-batch 1,
    global batch 1536 (the figure is at the full batch, after the ramp-up), sequence 2048, FP16,
    full recompute (--checkpoint-activations), the container of 2020-12 and Megatron-LM of
    2021-01: as the Narayanan rows' code, with --DDP-impl local (its default: the all-reduce
    after the backward) and no interleaving, but before the pipeline's scatter-gather (commit
    27fc468964, 2021-01-20), so each TP rank sends the whole activation. The 138 TFLOP/s are
    what a 32 s step gives in Narayanan et al.'s convention (recompute counted); the README
    gives no memory size, which the step does not depend on at this layout."""
    return [{"source": MEGATRON_GPT3_2021, "published": 138.0,
             "metric": "TFLOP/s/GPU (with recompute)", "layout_source": MEGATRON_GPT3_2021_SCRIPT,
             "run": {**MEGATRON_LM_A100, "id": "megatron-readme-gpt3-175b", "num_gpus": 1024,
                     "num_layers": 96, "hidden": 12288, "heads": 96, "tp": 8, "pp": 16,
                     "vpp": 1, "micro_batch": 1, "global_batch": 1536, "recompute": "full",
                     "sequence_parallel": False, "overlap_grad_reduce": False,
                     "tp_async_backward": False, "p2p_scatter_gather": False}}]


# What the rows of that README share: H100, vocabulary 131072, sequence 4096, BF16, no
# recompute, distributed optimizer, TE's TP communication overlap.
MEGATRON_H100_ROW = {"gpu": "h100-sxm", "vocab": 131072, "seq_length": 4096, "micro_batch": 1,
                     "recompute": "none", "precision": "bf16", "distributed_optimizer": True,
                     "tp_comm_overlap": True}


def megatron_h100_rows() -> list[dict]:
    rows = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops in MEGATRON_H100_RUNS:
        rows.append({
            "source": MEGATRON_H100, "published": tflops, "metric": "TFLOP/s/GPU",
            "vpp": "fastest", "micro_batch": "not published",
            "run": {**MEGATRON_H100_ROW, "id": f"megatron-h100-{name}", "num_gpus": gpus,
                    "num_layers": layers, "hidden": hidden, "heads": heads, "tp": tp, "pp": pp,
                    "global_batch": batch}})
    return rows


MEGATRON_BRIDGE = ("NeMo Megatron-Bridge docs/performance-summary.md, 25.11 NeMo container, "
                   "DGX-H100 table (commit 5776a6d90 of 2025-12-10), with the recipe of the same "
                   "commit (scripts/performance/configs/llama/llama3_llm_pretrain.py, "
                   "llama3_workload_base_configs.py, llama31_llm_pretrain.py, "
                   "llama31_workload_base_configs.py; src/megatron/bridge/recipes/llama/llama3.py; "
                   "for Qwen3: configs/qwen/qwen3_llm_pretrain.py, qwen3_workload_base_configs.py, "
                   "src/megatron/bridge/recipes/qwen/qwen3_moe.py)")
# Llama 3 70B (80 layers, hidden 8192, SwiGLU FFN 28672, 64 heads with 8 KV groups, vocabulary
# 128256, untied), FP8 with current scaling, 64 H100, sequence 8192, TP4 PP8 VP5, micro-batch 1,
# global batch 128: every knob published. The recipe: sequence parallelism, distributed
# optimizer with overlapped gradient reduction and parameter gathers, BF16 gradient reduction
# (`grad_reduce_in_fp32 = False`), no recompute, TE's TP communication overlap (with a
# hand-tuned userbuffers table; the model follows TE's default overlap pattern). The source's
# TFLOP/s count causal attention (half the score FLOPs Megatron-LM counted in 2024), so the
# row compares tokens per second, which needs no FLOP convention. Llama 3.1 405B (126 layers,
# hidden 16384, FFN 53248, 128 heads with 8 KV groups), FP8-CS on 1024 H100, TP8 PP8 CP2 VP8,
# micro-batch 1, global batch 512, the same recipe knobs; its 126 layers are split unevenly:
# the recipe counts the embedding and the loss as one layer each of the split
# (account_for_embedding/loss_in_pipeline_split), 128 / 64 chunks of 2, the first and the last
# chunk holding one transformer layer. No dropout: Bridge's Llama providers set hidden and
# attention dropout 0.0 (src/megatron/bridge/models/llama/llama_provider.py), its Qwen3 MoE
# provider too (models/qwen/qwen_provider.py). RoPE on Llama and Qwen3, fused (Megatron-LM's
# default, which the recipes leave on).
MEGATRON_BRIDGE_RUN = {"id": "bridge-llama3-70b-fp8", "gpu": "h100-sxm", "num_gpus": 64,
                       "num_layers": 80, "hidden": 8192, "ffn_hidden": 28672, "heads": 64,
                       "kv_heads": 8, "vocab": 128256, "seq_length": 8192, "tp": 4, "pp": 8,
                       "vpp": 5, "micro_batch": 1, "global_batch": 128, "recompute": "none",
                       "precision": "fp8", "swiglu": True, "distributed_optimizer": True,
                       "tp_comm_overlap": True, "grad_reduce_in_fp32": False,
                       "fp8_recipe": "current", "dropout": 0.0, "position_embedding": "rope"}


MEGATRON_BRIDGE_405B_RUN = {
    **MEGATRON_BRIDGE_RUN, "id": "bridge-llama31-405b-fp8", "num_gpus": 1024, "num_layers": 126,
    "hidden": 16384, "ffn_hidden": 53248, "heads": 128, "tp": 8, "cp": 2, "vpp": 8,
    "global_batch": 512, "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True}


# Llama 3 8B (32 layers, hidden 4096, FFN 14336, 32 heads with 8 KV groups) on one DGX-H100,
# FP8-CS, TP1 PP1 CP1, micro-batch 1, global batch 128 (16 micro-batches a step), the 70B's
# common knobs: the table's FSDP column gives Megatron-FSDP (weights, gradients and optimizer
# states sharded over the 8 GPUs); the recipe of the same commit full recompute of 5 layers by
# the block method (`recompute_num_layers=5`, which utils/overrides.py turns into granularity
# full, method block) and TP overlap off at TP 1. Without FSDP the model puts this layout over
# the H100's memory, which agrees with the table. The same table's GPT OSS 120B is not a row:
# every other layer attends over a 128-token window, with attention sinks, which the model
# does not describe.
MEGATRON_BRIDGE_8B_RUN = {
    **MEGATRON_BRIDGE_RUN, "id": "bridge-llama3-8b-fp8", "num_gpus": 8, "num_layers": 32,
    "hidden": 4096, "ffn_hidden": 14336, "heads": 32, "tp": 1, "pp": 1, "vpp": 1, "zero": 3,
    "recompute": "full", "recompute_num_layers": 5, "tp_comm_overlap": False}


MEGATRON_LLAMA = ("Megatron-LM examples/llama/README.md, 'FP8 Performance' (commit bf6e99859f of "
                  "2025-06-14), with NeMo's performance scripts of the same day, whose "
                  "configuration the README says it follows (NVIDIA/NeMo 7cc8bbb59e: "
                  "scripts/performance/recommended_model_configs/model_configs_h100.csv, "
                  "helpers.py, llm/pretrain_llama3_70b.py, llm/pretrain_llama31_405b.py, "
                  "nemo/collections/llm/recipes/precision/mixed_precision.py, "
                  "recipes/llama31_405b.py)")
# Llama 3 8B, 70B and 3.1 405B on H100, FP8: layout, micro-batch, global batch and sequence in
# the README's table, which names no software release. The knobs are those scripts': FP8 with
# delayed scaling (hybrid format, bf16_with_fp8_mixed), FP8 weights (fp8_param_gather), BF16
# gradient reduction, distributed optimizer with overlapped gradient reduction and parameter
# gathers, no recompute, TE's TP overlap where TP > 1 (userbuffers), the 405B's embedding and
# loss counted as pipeline layers; the models as the Megatron-Bridge rows above (the README's
# own 8B script, examples/llama/train_llama3_8b_h100_fp8.sh, sets the same FP8 flags). Of
# those scripts only pretrain_gpt3_175b.py sets tp_only_amax_red: these reduce their amaxes over
# TP x DP x CP, megatron-core's default.
MEGATRON_LLAMA_RUN = {**MEGATRON_BRIDGE_RUN, "fp8_recipe": "delayed", "fp8_params": True}
MEGATRON_LLAMA_RUNS = [
    # id, tokens/s/GPU, the run's fields over MEGATRON_LLAMA_RUN
    ("mlm-llama3-8b-fp8", 13812.0,
     {"num_gpus": 8, "num_layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32,
      "tp": 1, "pp": 1, "vpp": 1, "cp": 2, "tp_comm_overlap": False}),
    ("mlm-llama3-70b-fp8", 1621.0, {}),
    ("mlm-llama31-405b-fp8", 315.0,
     {"num_gpus": 1024, "num_layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128,
      "tp": 8, "cp": 2, "vpp": 8, "global_batch": 512,
      "account_for_embedding_in_pipeline_split": True,
      "account_for_loss_in_pipeline_split": True}),
]


def megatron_llama_rows() -> list[dict]:
    return [{"source": MEGATRON_LLAMA, "published": tokens, "metric": "tokens/s/GPU",
             "run": {**MEGATRON_LLAMA_RUN, "id": run_id, **fields}}
            for run_id, tokens, fields in MEGATRON_LLAMA_RUNS]


def megatron_bridge_rows() -> list[dict]:
    return [{"source": MEGATRON_BRIDGE, "published": 14451.0, "metric": "tokens/s/GPU",
             "run": MEGATRON_BRIDGE_8B_RUN},
            {"source": MEGATRON_BRIDGE, "published": 1602.0, "metric": "tokens/s/GPU",
             "run": MEGATRON_BRIDGE_RUN},
            {"source": MEGATRON_BRIDGE, "published": 292.0, "metric": "tokens/s/GPU",
             "run": MEGATRON_BRIDGE_405B_RUN},
            {"source": MEGATRON_BRIDGE, "published": 1575.0, "metric": "tokens/s/GPU",
             "run": QWEN3_235B_RUN}]


NEMO = ("NVIDIA NeMo docs/source/performance/performance_summary.md, 'Pretraining', NeMo "
        "24.07 container, DGX-H100, FP8 (commit 070a0bb168)")
# Layout, micro-batch, global batch and sequence are published; the software knobs are not,
# so these are assumptions: TE FP8 with delayed scaling (NeMo's hybrid format), sequence
# parallelism and TE's TP overlap where tp > 1, distributed optimizer with overlapped gradient
# and parameter sync, BF16 gradient sync (NeMo-Megatron-Launcher's GPT-3 configs set
# `grad_sync_dtype: bf16`; with FP32 gradients the model puts three of these layouts over
# 80 GB), no recompute, flash attention. GPT-3: GeLU MLP 4h, GPT-2 vocabulary padded to
# 50304, tied embeddings, dropout 0.1, learned absolute positions; Llama 2 / 3: SwiGLU, untied,
# no dropout, RoPE with `apply_rope_fusion: true` (NeMo-Framework-Launcher's
# launcher_scripts/conf/training/gpt3/5b.yaml and llama/llama2_7b.yaml). The amax reduction of
# delayed scaling over TP x DP x CP, blocking: NeMo 24.07 runs Transformer Engine 1.8, which no
# longer reads the NVTE_DP_AMAX_REDUCE_INTERVAL the launcher had set (its a6490ffe of
# 2024-07-15 removes it as deprecated), and the launcher's configs do not set
# tp_only_amax_red. Compared in tokens per second.
GPT3 = {"swiglu": False, "untie_embeddings": False, "dropout": 0.1}
LLAMA = {"swiglu": True, "dropout": 0.0, "position_embedding": "rope"}
NEMOTRON = {"swiglu": False, "dropout": 0.0, "position_embedding": "rope"}  # squared ReLU
NEMO_MODELS = {
    # layers, hidden, heads, kv heads, ffn (0: 4h), vocab, sequence, family
    "gpt3-5b": (24, 4096, 32, 32, 0, 50304, 2048, GPT3),
    "gpt3-20b": (44, 6144, 48, 48, 0, 50304, 2048, GPT3),
    "gpt3-175b": (96, 12288, 96, 96, 0, 50304, 2048, GPT3),
    "llama2-7b": (32, 4096, 32, 32, 11008, 32000, 4096, LLAMA),
    "llama2-13b": (40, 5120, 40, 40, 13824, 32000, 4096, LLAMA),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000, 4096, LLAMA),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, LLAMA),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192, LLAMA),
    # The launcher's training/nemotron/nemotron_{8b,22b,340b}.yaml (at 1ab2c781, 2024-08-13):
    # squared-ReLU MLP 4h, RoPE on half of each head (the model rotates whole heads, 0.2-1.1% of
    # these steps, so half of that too slow), untied embeddings, no dropout, the
    # 256000-token vocabulary; GQA with 8 groups in the 340B. The 340B does not fit in 80 GB
    # under this source's assumptions (80.4 GB predicted), so it takes its launcher config's
    # knobs instead: selective recompute, no TP overlap, BF16 weights (no fp8_params) and Apex's
    # distributed Adam with `dtype: bf16` and BF16 gradient sync (4 B a parameter, as
    # bench/dgxc_rows.py reads NeMo 1's choice), the DGX Cloud recipe's layout and knobs but FP8
    # weights.
    "nemotron-8b": (32, 4096, 32, 32, 0, 256000, 4096, NEMOTRON),
    "nemotron-22b": (40, 6144, 48, 48, 0, 256000, 4096, NEMOTRON),
    "nemotron-340b": (96, 18432, 96, 8, 0, 256000, 4096,
                      {**NEMOTRON, "recompute": "selective", "tp_comm_overlap": False,
                       "fp8_params": False, "optimizer_state_bytes": 4}),
}
# Apex's gradient buckets (`dfa_bucket_cap_mb`): the launcher config's `optim.bucket_cap_mb`
# (at 1ab2c781: GPT-3 5B 400, 20B and 175B 220, Llama 2 and 3 125, Nemotron 8B and 22B 100,
# 340B 50).
NEMO_BUCKET_CAP_MB = {"gpt3-5b": 400, "gpt3-20b": 220, "gpt3-175b": 220, "llama2-7b": 125,
                      "llama2-13b": 125, "llama2-70b": 125, "llama3-8b": 125, "llama3-70b": 125,
                      "nemotron-8b": 100, "nemotron-22b": 100, "nemotron-340b": 50}
NEMO_RUNS = [
    # model, GPUs, global batch, micro-batch, tp, pp, cp, vp, tokens/s per GPU
    ("gpt3-5b", 64, 2048, 4, 1, 1, 1, 1, 22521),
    ("gpt3-20b", 64, 256, 2, 2, 1, 1, 1, 5851),
    ("gpt3-175b", 128, 256, 1, 4, 8, 1, 6, 726),
    ("gpt3-175b", 512, 2048, 2, 4, 8, 1, 6, 782),
    ("llama2-7b", 8, 128, 1, 1, 1, 1, 1, 16847),
    ("llama2-13b", 16, 128, 1, 1, 4, 1, 10, 8646),
    ("llama2-70b", 64, 128, 1, 4, 4, 1, 20, 1707),
    ("llama3-8b", 8, 128, 1, 1, 1, 2, 1, 12036),
    ("llama3-70b", 64, 128, 1, 4, 4, 2, 5, 1533),
    ("nemotron-8b", 64, 256, 4, 2, 1, 1, 1, 12701),
    ("nemotron-22b", 64, 256, 2, 2, 4, 1, 10, 4256),
    ("nemotron-340b", 128, 32, 1, 8, 8, 1, 12, 322),
]


def nemo_rows() -> list[dict]:
    rows = []
    for model, gpus, batch, mbs, tp, pp, cp, vp, tokens in NEMO_RUNS:
        layers, hidden, heads, kv, ffn, vocab, seq, family = NEMO_MODELS[model]
        rows.append({
            "source": NEMO, "published": float(tokens), "metric": "tokens/s/GPU",
            "run": {"id": f"nemo-{model}-{gpus}", "gpu": "h100-sxm", "num_gpus": gpus,
                    "num_layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv,
                    "ffn_hidden": ffn or None, "vocab": vocab, "seq_length": seq,
                    "tp": tp, "pp": pp,
                    "cp": cp, "vpp": vp, "micro_batch": mbs, "global_batch": batch,
                    "precision": "fp8", "distributed_optimizer": True,
                    "dfa_bucket_cap_mb": NEMO_BUCKET_CAP_MB[model],
                    "tp_comm_overlap": tp > 1, "grad_reduce_in_fp32": False, **family}})
    return rows


# Outside the table (its layout is not published): the same README's strong scaling of the
# 177B model at global batch 1152, "MFU from 47% to 42%" between 96 and 4608 GPUs, read with
# the weak-scaling table's TP8 PP6 (96 = 48 x 2).
STRONG_SCALING = [(96, 0.47), (4608, 0.42)]


# The table's 25.11 H100 rows on Megatron-Bridge's later releases, outside the table: every
# DGX-H100 pre-training row of the archive at the same TP, PP, CP, VP, EP and micro-batch as a
# 25.11 row ("FP8" there, FP8-CS in 25.11's table and the recipes' names), each at a larger
# global batch than 25.11's. The recipes of those releases were not read for other changes:
# the model keeps each 25.11 row's knobs and moves only with the batch.
BRIDGE_LATER = ("Megatron-Bridge docs/performance-summary-archive.md (commit 4ab94dfad of "
                "2026-08-11), the DGX-H100 pre-training rows of the 26.02-26.06 containers "
                "at the layouts of the table's 25.11 rows")
BRIDGE_LATER_RUNS = [
    # the 25.11 row, its 25.11 figure, the later global batch, {release: tokens/s/GPU}
    (MEGATRON_BRIDGE_RUN, 1602.0, 256,
     {"26.02": 1621.0, "26.02.01": 1639.0, "26.04": 1633.0, "26.04.01": 1664.0}),
    (MEGATRON_BRIDGE_405B_RUN, 292.0, 1536, {"26.02": 311.0, "26.04.01": 328.0, "26.06": 326.0}),
    (QWEN3_235B_RUN, 1575.0, 8192,
     {"26.02": 1633.0, "26.02.01": 1611.0, "26.04": 1686.0, "26.04.01": 1712.0}),
]


# Another trainer on Hopper, outside the table: the model describes Megatron's execution, and
# this run is torchtitan's. TORCHTITAN's benchmark: Llama 3.1 8B (32 layers, hidden 4096, MLP
# 14336 with SwiGLU, 32 heads with 8 KV groups, vocabulary 128256, untied, RoPE, no dropout) on
# 4 and 8 nodes of 8 H200 with 400 Gb/s per GPU; FSDP over every GPU (ZeRO-3), torch.compile,
# torchao float8 with dynamic tensorwise scaling and FP8 all-gathers (the output layer stays
# BF16: its llama3_8b.toml filters "output"), local batch 2, sequence 8192 (the same toml).
# Its activation checkpointing, 'selective' by op, saves every matmul output but every second
# one, and attention's, and recomputes the rest: none of Megatron's recompute modes, so the
# bench brackets it between no recompute and full recompute.
TORCHTITAN = ("torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (Trainy on "
              "WhiteFiber, 2025-06; torch 2.8.0a0, torchtitan e7c0cae), with "
              "torchtitan/models/llama3/train_configs/llama3_8b.toml")
TORCHTITAN_RUN = {"gpu": "h200", "num_layers": 32, "hidden": 4096, "ffn_hidden": 14336,
                  "heads": 32, "kv_heads": 8, "vocab": 128256, "seq_length": 8192, "tp": 1,
                  "pp": 1, "micro_batch": 2, "precision": "fp8", "fp8_recipe": "current",
                  "swiglu": True, "distributed_optimizer": True, "zero": 3, "dropout": 0.0,
                  "position_embedding": "rope"}
TORCHTITAN_RUNS = [(32, 10938.0), (64, 10753.0)]  # GPUs, published tokens/s/GPU
