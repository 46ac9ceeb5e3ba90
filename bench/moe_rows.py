"""Published MoE runs with their layout and throughput, each with its source: Mixtral on
Megatron-Core v0.8, the Megatron-Core MoE team's Qwen3 recipes and best-practice tables, and the
fine-grained Qwen3 rows of Megatron-Bridge's performance summary. Data only, as
`published_rows.py` (whose header says how the rows read).
"""

from __future__ import annotations

MEGATRON_MOE = ("Megatron-LM megatron/core/transformer/moe/README.md (Megatron-Core v0.8, "
                "commit 0b981f9c53 of 2024-08-02): 'Mixtral 8X7B bf16 training to achieve 438 "
                "TFLOPS as of MCore v0.8', with the same file's 'Reference Best Parallel Mapping'")
# Mixtral 8x7B (32 layers, hidden 4096, 8 experts of 14336 with SwiGLU, top-2, 32 heads with 8
# KV groups, vocabulary 32K, untied), dropless with the all-to-all dispatcher, BF16, 64 H100
# (8 x 400 Gb/s InfiniBand per node), sequence 4096, TP1 EP8 PP4 VP8, micro-batch 1, global
# batch 256; the file's practice section: distributed optimizer with overlapped gradient
# reduction and parameter gathers, TE 1.9's grouped GEMM (one local expert here, so one GEMM).
# No dropout: the file leaves it out; Megatron-LM's Mixtral example
# (examples/mixtral/train_mixtral_8x7b_distributed.sh) sets --attention-dropout 0.0
# --hidden-dropout 0.0. RoPE, fused as Megatron-LM fuses it unless told --no-rope-fusion.
MEGATRON_MOE_RUN = {"id": "megatron-moe-mixtral-8x7b", "gpu": "h100-sxm", "num_gpus": 64,
                    "num_layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32,
                    "kv_heads": 8, "vocab": 32000, "seq_length": 4096, "tp": 1, "pp": 4,
                    "ep": 8, "vpp": 8, "micro_batch": 1, "global_batch": 256,
                    "recompute": "none", "precision": "bf16", "swiglu": True, "num_experts": 8,
                    "moe_topk": 2, "distributed_optimizer": True, "dropout": 0.0,
                    "position_embedding": "rope"}


def megatron_moe_rows() -> list[dict]:
    return [{"source": MEGATRON_MOE, "published": 438.0, "metric": "TFLOP/s/GPU",
             "run": MEGATRON_MOE_RUN}]


MODELZOO_MIXTRAL = ("yanring/Megatron-MoE-ModelZoo best_practice/Mixtral/run_mixtral_8x22B.sh "
                    "(commit b09773a8ff of 2025-12-16; unchanged, renamed to "
                    "best_practice/mixtral/, at e8650517d6 of 2026-05-16): 'Dropless training "
                    "with forced balancing, performance should be around 465 TFLOPS for H100', "
                    "with runtime.conf, "
                    "sbatch_benchmarking.sh and model_configs/benchmarking/Mixtral-8x22B.yaml of "
                    "the same commit; TFLOP/s with causal attention")
# Mixtral 8x22B (56 layers, hidden 6144, 8 experts of 16384 with SwiGLU, top-2, 48 heads with 8
# KV groups, Llama 2's 32000-token vocabulary, untied), BF16, 128 H100 (16 nodes), sequence
# 4096, TP2 (sequence parallel, with the --tp-comm-overlap the script adds to every BF16 run)
# PP8 VP7 (one layer a virtual stage) EP8 with expert TP 1, micro-batch 1, global batch 256;
# the all-to-all dispatcher, grouped GEMMs, fused permutation and router, distributed optimizer
# with overlapped gradient reduction and parameter gathers, flash attention, no dropout, no
# recompute, no EP overlap. Forced balancing is the routing the model assumes; the same file
# gives dropless training with the learned router ~445, token dropping ~470 and blockwise FP8
# (which the model lacks) ~560. Its first version of the same day said 455 for both.
MIXTRAL_8X22B_RUN = {"id": "modelzoo-mixtral-8x22b", "gpu": "h100-sxm", "num_gpus": 128,
                     "num_layers": 56, "hidden": 6144, "ffn_hidden": 16384, "heads": 48,
                     "kv_heads": 8, "vocab": 32000, "seq_length": 4096, "tp": 2, "pp": 8,
                     "vpp": 7, "ep": 8, "etp": 1, "micro_batch": 1, "global_batch": 256,
                     "recompute": "none", "precision": "bf16", "swiglu": True,
                     "num_experts": 8, "moe_topk": 2, "distributed_optimizer": True,
                     "tp_comm_overlap": True, "dropout": 0.0, "position_embedding": "rope",
                     "moe_dispatcher": "alltoall"}


def modelzoo_mixtral_rows() -> list[dict]:
    return [{"source": MODELZOO_MIXTRAL, "published": 465.0,
             "metric": "TFLOP/s/GPU (causal attention)", "run": MIXTRAL_8X22B_RUN}]


MEGATRON_RECIPES = ("Megatron-LM examples/moe_recipes/README.md, 'Median TFLOP/s/GPU' (dev "
                    "branch, commit 9c5258f109 of 2026-08-11), with the recipes of the same "
                    "commit (qwen3_30b/h100/bf16_32GPU_TP1PP1EP8.yaml, "
                    "qwen3_235b/h100/bf16_256GPU_TP2PP8EP32.yaml); TFLOP/s with causal attention "
                    "(megatron/training/training.py of that commit)")
# The Megatron-Core MoE team's H100 BF16 recipes of 2026 (PyTorch 26.03, TE 2.14), every knob
# in the YAML: force-balanced routing, the flex dispatcher with the HybridEP backend (DeepEP's
# hybrid-ep branch; `moe_dispatcher` flex), grouped GEMMs,
# fused permutation and router, distributed optimizer with overlapped gradient reduction and
# parameter gathers, FP32 gradient reduction (Megatron-LM's default with BF16), no dropout.
# Qwen3-30B-A3B on 32 H100: TP1 PP1 EP8, micro-batch 1, global batch 256, no recompute, no EP
# overlap. Qwen3-235B-A22B on 256 H100: TP2 (sequence parallel) PP8 EP32, 3 layers a virtual
# stage with the embedding and the loss counted as layers (96 / 24: V4), micro-batch 1, global
# batch 2048, the EP overlap with delayed weight gradients, selective recompute of moe_act and
# layernorm; megatron-core skips the pre-MLP norm's recompute under the recipe's router CUDA
# graph with the flex dispatcher (`can_recompute_pre_mlp_layernorm_for_cudagraph` in
# transformer_layer.py of the same commit) and the other norms are fused into TE's GEMMs, so
# moe_act alone is recomputed.
QWEN3_30B_RECIPE_RUN = {
    "id": "recipe-qwen3-30b-a3b-bf16", "gpu": "h100-sxm", "num_gpus": 32, "num_layers": 48,
    "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "vocab": 151936,
    "seq_length": 4096, "tp": 1, "pp": 1, "ep": 8, "etp": 1, "micro_batch": 1,
    "global_batch": 256, "precision": "bf16", "swiglu": True, "num_experts": 128, "moe_topk": 8,
    "moe_ffn_hidden": 768, "distributed_optimizer": True, "qk_layernorm": True, "dropout": 0.0,
    "position_embedding": "rope", "moe_dispatcher": "flex"}
QWEN3_235B_RECIPE_RUN = {
    **QWEN3_30B_RECIPE_RUN, "id": "recipe-qwen3-235b-a22b-bf16", "num_gpus": 256,
    "num_layers": 94, "hidden": 4096, "heads": 64, "moe_ffn_hidden": 1536, "tp": 2, "pp": 8,
    "vpp": 4, "ep": 32, "global_batch": 2048, "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True, "moe_a2a_overlap": True,
    "delay_wgrad_compute": True,
    "recompute": "selective", "recompute_modules": ["moe_act"]}


# Outside the table, a ranking check: one model, one GPU type, five layouts, from the same
# team's earlier best-practice table (step times; the H100 rows' own 'Code' column gives two
# code versions). DeepEP is the flex dispatcher as HybridEP above, "A2A" the all-to-all one;
# "norm, act" is selective recompute of layernorm and moe_act (no CUDA graphs in these rows,
# so megatron-core recomputes the pre-MLP norm too); "FSDP" is Megatron-FSDP sharding weights,
# gradients and optimizer states (zero 3).
MODELZOO = ("yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md (commit c1ad0b5c89), "
            "H100 table, Qwen3-235B-A22B, 256 H100, BF16, sequence 4096, global batch 2048, "
            "with model_configs/benchmarking/Qwen3-235B-A22B.yaml (embedding and loss counted "
            "as pipeline layers)")
NORM_ACT = {"recompute": "selective", "recompute_modules": ["layernorm", "moe_act"]}
A2A_OVERLAP = {"moe_a2a_overlap": True, "delay_wgrad_compute": True}
MODELZOO_BASE = {key: value for key, value in QWEN3_235B_RECIPE_RUN.items()
                 if key not in ("recompute", "recompute_modules", "moe_a2a_overlap",
                                "delay_wgrad_compute")}
MODELZOO_RUNS = [
    # label, code, published step s, the run's fields over MODELZOO_BASE
    ("DeepEP EP32, norm+act", "moe_dev f3e6c5", 19.7, NORM_ACT),
    ("DeepEP EP32, norm+act, EP overlap", "moe_dev f3e6c5", 17.6,
     {**NORM_ACT, **A2A_OVERLAP}),
    ("DeepEP EP8, FSDP, full recompute", "main 1e057005", 17.6,
     {"ep": 8, "pp": 1, "vpp": 1, "zero": 3, "micro_batch": 4, "recompute": "full"}),
    ("all-to-all EP8, norm+act", "main 1e057005", 24.2,
     {**NORM_ACT, "ep": 8, "pp": 32, "vpp": 3, "moe_dispatcher": "alltoall"}),
    ("DeepEP EP8 TP4, no recompute", "main 1e057005", 29.0, {"ep": 8, "tp": 4, "vpp": 4}),
]


# The same file's long-context table (H100, BF16, DeepEP): Qwen3-235B-A22B on 32 nodes, TP4
# PP8 VP4 EP8 and CP growing with the sequence, global batch 256, micro-batch 1 (the ModelZoo's
# runtime.conf), selective recompute of layernorm and moe (its command line), no EP overlap;
# TFLOP/s with forced load balancing (the model's balanced routing; dropless beside it in the
# README), counted with causal attention as Megatron-LM has since 2025-03 (commit 8873b55d6a).
MODELZOO_LONG_CONTEXT = ("yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md (commit "
                         "c1ad0b5c89), 'Long Context' table, Qwen3-235B-A22B on 256 H100, BF16, "
                         "DeepEP, forced load balancing, with its command line and runtime.conf; "
                         "TFLOP/s with causal attention")
LONG_CONTEXT_RUNS = [(16384, 1, 295.0), (32768, 2, 335.0), (65536, 4, 368.0), (131072, 8, 389.0)]


def long_context_rows() -> list[dict]:
    return [{"source": MODELZOO_LONG_CONTEXT, "published": tflops,
             "metric": "TFLOP/s/GPU (causal attention)",
             "run": {**MODELZOO_BASE, "id": f"modelzoo-qwen3-235b-{seq // 1024}k",
                     "seq_length": seq, "tp": 4, "cp": cp, "ep": 8, "global_batch": 256,
                     "recompute": "selective", "recompute_modules": ["layernorm", "moe"]}}
            for seq, cp, tflops in LONG_CONTEXT_RUNS]


def megatron_recipe_rows() -> list[dict]:
    return [{"source": MEGATRON_RECIPES, "published": tflops,
             "metric": "TFLOP/s/GPU (causal attention)", "run": run}
            for run, tflops in ((QWEN3_30B_RECIPE_RUN, 234.1), (QWEN3_235B_RECIPE_RUN, 214.3))]


# Fine-grained MoE (experts narrower than the hidden size) on DGX-H100, FP8, force-balanced
# routing, from Megatron-Bridge's performance summary (`published_rows.MEGATRON_BRIDGE`), which
# keeps the previous release's table below its own: the 25.11 container (dropless) and the
# 25.09 one (token dropping), at the same layouts. Both recipes overlap the EP all-to-all with
# another micro-batch (`moe_a2a_overlap`), with delayed weight gradients (Bridge's
# scripts/performance/utils/overrides.py sets both). The model counts the router's GEMM and the
# permutation's memory traffic (`moecost`), not the host work per local expert, which cannot
# explain the 30B's gap (README). Qwen3-235B-A22B's 25.11 figure is a table row
# (`published_rows.megatron_bridge_rows`); Qwen3-30B-A3B stays outside, its error unexplained.
# Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads of 128 with 4 KV groups, 128 experts of 768,
# top-8, SwiGLU, vocabulary 151936, untied; 16 H100, TP1 PP2 VP24 EP8 (expert TP 1), micro-batch
# 2, global batch 512, sequence 4096 (its 121 TFLOP/s/GPU at 5275 tokens/s are 22.9 GFLOP a
# token, what this description gives with causal attention); the recipe of the same commit
# sets VP 12 where the table says 24 (the prediction moves 0.1%).
QWEN3_30B_RUN = {"id": "bridge-qwen3-30b-a3b-fp8", "gpu": "h100-sxm", "num_gpus": 16,
                 "num_layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
                 "vocab": 151936, "seq_length": 4096, "tp": 1, "pp": 2, "vpp": 24, "ep": 8,
                 "etp": 1, "micro_batch": 2, "global_batch": 512, "precision": "fp8",
                 "fp8_recipe": "current", "swiglu": True, "num_experts": 128, "moe_topk": 8,
                 "moe_ffn_hidden": 768, "distributed_optimizer": True,
                 "grad_reduce_in_fp32": False, "moe_a2a_overlap": True,
                 "delay_wgrad_compute": True, "qk_layernorm": True, "dropout": 0.0,
                 "position_embedding": "rope"}
# Qwen3-235B-A22B: 94 layers, hidden 4096, 64 heads of 128 with 4 KV groups, 128 experts of
# 1536, top-8; 256 H100, TP2 (sequence parallel, no TP overlap: the H100 recipe turns it off)
# PP8 VP4 EP32 (expert TP 1), the embedding and the loss counted as pipeline layers (the
# recipe, `qwen3_moe.py`), micro-batch 1, global batch 2048.
QWEN3_235B_RUN = {**QWEN3_30B_RUN, "id": "bridge-qwen3-235b-a22b-fp8", "num_gpus": 256,
                  "num_layers": 94, "hidden": 4096, "heads": 64, "tp": 2, "pp": 8, "vpp": 4,
                  "ep": 32, "micro_batch": 1, "global_batch": 2048, "moe_ffn_hidden": 1536,
                  "account_for_embedding_in_pipeline_split": True,
                  "account_for_loss_in_pipeline_split": True}
# (run, {release: published tokens/s/GPU}); 25.11 says FP8-CS, 25.09's table gives no
# precision (its notes speak only of FP8 scaling granularities).
FINE_GRAINED_MOE = [
    (QWEN3_30B_RUN, {"25.11 dropless": 5275.0, "25.09 token drop": 10494.0}),
    (QWEN3_235B_RUN, {"25.11 dropless": 1575.0, "25.09 token drop": 1204.0}),
]
