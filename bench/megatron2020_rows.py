"""The Megatron-LM README's scaling tables of 2020-09 as rows of the validation table
(`published_runs.py`): the table's only V100 runs, and A100 runs with 128-way data
parallelism over the nodes' InfiniBand, each with its iteration time."""

from published_rows import MEGATRON_LM_A100, TORCH_DDP_BUCKET_MB

MEGATRON_2020 = ("Megatron-LM README of 2020-09-11 (commit 5281919420, merged into main with "
                 "the fused kernels of 51a2e6b0ff at 19301985dd; images/cases.png, "
                 "scaling-mp.png, scaling-dp.png): GPT-2 weak scaling, iteration time, on a "
                 "DGX-2 (V100, batch 8), a DGX-A100 (batch 16) and DGX-A100s with 128-way data "
                 "parallelism (global batch 2048)")
MEGATRON_2020_SCRIPT = ("Megatron-LM examples/pretrain_gpt2_distributed.sh of the same commit "
                        "(sequence 1024, --checkpoint-activations, --fp16); --DDP-impl as the "
                        "same README advises: torch from TP4, local below")
# What the tables' TFLOP/s confirm: each is Narayanan et al.'s count with the recompute pass
# for sequence 1024 and the vocabulary padded to 51200 (1B on one V100: 8.06e13 FLOP in
# 1.121 s, the published 71.9; 8B on eight, 52.2), so every layer's activations were
# checkpointed. The software is Megatron-LM of 2020-09 with the speed optimizations merged the
# same second as the README (fused upper-triangular masked softmax, fused bias-GeLU and
# bias-dropout-add; flags a user set then, which the example script does not, but the same
# four cases ran 7-13% slower before them, 1288-1508 ms in the NV-ADLR blog of 2020-05): the
# Narayanan rows' reading (MEGATRON_LM_A100) without a pipeline, TP all-reduces blocking.
# The README's "batch size" is a model replica's, one micro-batch a step.
# Which DDP the data-parallel rows ran is not in the tables; the README of the same commit says
# PyTorch's (FP16 gradients all-reduced in 25 MB buckets during the backward) "is more
# efficient at larger model parallel sizes" (the 8.3B at MP8 of 2019: 60% -> 76% scaling) and
# slower at MP1 and MP2, where Megatron's local DDP (one flattened all-reduce after the
# backward) is its default: so torch from TP4 on. The published cost of DP128 agrees at TP8:
# 37 ms a step, where a 2.2 GB all-reduce across 128 nodes not overlapped takes ~180 ms (with
# local DDP the 4B row reads -5.1%, the 8B +3.1%). A100 40 GB: the 80 GB board came in
# 2020-11. DGX-2: 16 V100 SXM3 32 GB on NVSwitch (the team's 2019 runs were on DGX-2H, whose
# 450 W boards clock above the profile's data sheet; this README says DGX-2).
MEGATRON_2020_CASES = [
    # case, hidden, heads, layers, tp (= GPUs of a replica)
    ("1B", 1920, 15, 24, 1),
    ("2B", 2304, 18, 30, 2),
    ("4B", 3072, 24, 36, 4),
    ("8B", 4096, 32, 42, 8),
]
MEGATRON_2020_TABLES = [
    # label, GPU profile, GPUs a node, batch a replica, data-parallel size, then per case the
    # iteration time (ms) and TFLOP/s per GPU the table gives
    ("v100", "v100-32gb", 16, 8, 1, (1121, 1093, 1238, 1407), (71.9, 64.2, 58.5, 52.2)),
    ("a100", "a100-40gb", 8, 16, 1, (1076, 1026, 1162, 1343), (149.8, 136.8, 124.7, 109.3)),
    ("a100-dp128", "a100-40gb", 8, 16, 128, (1153, 1101, 1242, 1380),
     (139.8, 127.5, 116.7, 106.5)),
]


def megatron2020_rows() -> list[dict]:
    rows = []
    for label, gpu, per_node, batch, dp, times_ms, tflops in MEGATRON_2020_TABLES:
        for (case, hidden, heads, layers, tp), ms, tf in zip(MEGATRON_2020_CASES, times_ms,
                                                             tflops, strict=True):
            torch_ddp = dp > 1 and tp >= 4
            rows.append({
                "source": MEGATRON_2020, "published": ms / 1000, "metric": "iteration time s",
                "layout_source": MEGATRON_2020_SCRIPT, "tflops_published": tf,
                "bucket_mb": TORCH_DDP_BUCKET_MB if torch_ddp else None,
                "run": {**MEGATRON_LM_A100, "id": f"megatron20-{label}-{case}", "gpu": gpu,
                        "gpus_per_node": per_node, "seq_length": 1024, "num_gpus": tp * dp,
                        "num_layers": layers, "hidden": hidden, "heads": heads, "tp": tp,
                        "pp": 1, "vpp": 1, "micro_batch": batch, "global_batch": batch * dp,
                        "recompute": "full", "sequence_parallel": False,
                        "overlap_grad_reduce": torch_ddp, "tp_async_backward": False}})
    return rows
