"""BigScience's BLOOM 176B as a row of the validation table (`published_runs.py`): a run of
another team's software (Megatron-DeepSpeed) on another cluster (Jean Zay), with its data
parallelism across nodes over a network of 50 Gb/s a GPU, a quarter of Selene's."""

BLOOM = ("BigScience tr11-176B-ml (bigscience-workshop/bigscience train/tr11-176B-ml/: "
         "chronicles.md and README.md at e726b15982, tr11-176B-ml.slurm at 003b25057e, the "
         "48-node script of the main run): the log line the chronicles quote on 2022-03-18, the "
         "first at the full global batch of 2048, iteration 12695: 'elapsed time per iteration "
         "(s): 105.22 ... TFLOPs: 149.02'")
# Why that line: it is the step of the slurm script as written. From 2022-03-24 the run added a
# TP all-reduce of every LayerNorm's weights to each forward (the chronicles' "layer-norm
# auto-sync" band-aid); its later lines read 105.9-107.5 s (April) and 104.70 s (the end of
# the first epoch, the README's "Important checkpoints"). One iteration a line
# (`--log-interval 1`); the README's "about 105 secs" throughout.
# What the slurm script and the README set: 384 A100 80 GB, 8 a node with 4 Omni-Path links of
# 100 Gb/s (50 Gb/s a GPU; the profile's NVSwitch taken for the README's "NVLink 4 inter-gpu
# connects"), TP4 PP12 DP8, micro-batch 2, sequence 2048, the vocabulary padded to 250880,
# BF16, every layer's activations checkpointed (full recompute), Megatron-LM's dropout 0.1,
# ALiBi (a bias inside the fused softmax: no position-embedding pass), tied embeddings counted
# as pipeline layers (`--pp-partition-method 'type:transformer|embedding'`: the first and the
# last stage hold 5 blocks beside the embedding, as megatron-core's account_for_* splits do).
# The software (Megatron-DeepSpeed of 2022, PyTorch 1.11, DeepSpeed's pipeline engine): no
# FlashAttention (the fused masked softmax), blocking TP all-reduces both ways
# (`copy_to_tensor_model_parallel_region`), no sequence parallelism, pipeline sends of whole
# activations from every TP rank without overlap. DeepSpeed's BF16_Optimizer (ZeRO stage 0
# with its own stage-1 sharding of the FP32 master weights and moments): after every
# micro-batch's backward it adds the BF16 gradients autograd left in `param.grad` into an
# FP32 buffer, an unfused pass as `grad_buffer` false models (DeepSpeed's moves 10 B a
# parameter where the model counts 6; with `grad_buffer` true the row reads 91.8 s, -12.7%);
# after the pipeline flush it all-reduces that buffer (the model's distributed optimizer
# reduce-scatters it: half the bytes, ~1 s of the step less) and all-gathers the BF16
# weights, neither overlapped. Not modelled: the script's CUDA_LAUNCH_BLOCKING=1 (the README:
# "a tiny impact or no impact at all"; chronicles-prequel.md measured 0-6% on 80-320 GPUs) and
# the embedding's LayerNorm.
BLOOM_RUN = {
    "id": "bloom-176b", "gpu": "a100-80gb", "num_gpus": 384, "gpus_per_node": 8,
    "nic_gbit_per_gpu": 50, "num_layers": 70, "hidden": 14336, "heads": 112,
    "vocab": 250880, "seq_length": 2048, "tp": 4, "pp": 12, "dp": 8, "micro_batch": 2,
    "global_batch": 2048, "recompute": "full", "precision": "bf16",
    "flash_attention": False, "position_embedding": "none", "sequence_parallel": False,
    "tp_async_backward": False, "p2p_scatter_gather": False, "overlap_p2p_comm": False,
    "untie_embeddings": False, "distributed_optimizer": True, "grad_buffer": False,
    "overlap_grad_reduce": False, "overlap_param_gather": False,
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True}
BLOOM_STEP_S = 105.22


def bloom_rows() -> list[dict]:
    return [{"source": BLOOM, "published": BLOOM_STEP_S, "metric": "iteration time s",
             "run": dict(BLOOM_RUN)}]


BLOOM_LAYOUTS = ("BigScience tr11-176B-ml chronicles-prequel.md (bigscience-workshop/bigscience, "
                 "commit 053adafee8), 'Rebalancing layers', the table for NHIDDEN=14336 / "
                 "NLAYERS=70 (the final 176B) of 2022-02-28: 48 nodes of the same cluster, "
                 "BF16_Optimizer and the embedding counted as a pipeline layer, global batch "
                 "2048; seconds per iteration, each the second iteration of one run")
# The same software and cluster as BLOOM_RUN, two weeks before the launch; the authors warn
# that a single (second) iteration "can fluctuate a bit".
BLOOM_LAYOUT_RUNS = [
    # label, measured on, published step s, the run's fields over BLOOM_RUN
    ("TP8 PP12 DP4 mbs2 64 heads", "2022-02-28", 121.63,
     {"tp": 8, "dp": 4, "heads": 64}),
    ("TP4 PP12 DP8 mbs2 64 heads", "2022-02-28", 102.03, {"heads": 64}),
    ("TP4 PP12 DP8 mbs2 112 heads", "2022-02-28", 104.50, {}),
    ("TP4 PP12 DP8 mbs2 128 heads", "2022-02-28", 105.89, {"heads": 128}),
    ("TP4 PP12 DP8 mbs4 64 heads", "2022-02-28", 102.27, {"heads": 64, "micro_batch": 4}),
]
