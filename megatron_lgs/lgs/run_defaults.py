"""What a run that leaves a setting unset is read as, where the answer depends on the run.

`predict`'s input names a published run by the issue's fields; the software settings that moved
its step are mostly not among them. Three of them are read from the run itself, and each line
of `predict` names what was read this way (`assumed`):

- The pipeline split of a model whose layers do not divide over the stages (Llama 3.1 405B's
  126 on 8 or 16 stages, Qwen3-235B's 94 on 8, BLOOM's 70 on 12). megatron-core refuses such a
  model without an uneven split, so the run had one. Tried in order, the first megatron-core
  accepts (`workload.layer_split`): the embedding and the loss counted as one layer each
  (Megatron-LM's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split,
  how NVIDIA's recipes for the 405B and Qwen3-235B split them, and how Megatron-DeepSpeed
  split BLOOM), or only one of them; then a lighter last stage
  (--decoder-last-pipeline-num-layers), every other stage holding the share rounded up;
  then lighter first and last stages (--decoder-first-pipeline-num-layers too), or heavier
  ones where the stages between them cannot take fewer layers.
- The experts' tensor parallelism of an MoE run with TP: 1, each expert whole on its GPU,
  where the experts are narrower than the hidden size (fine-grained: Qwen3's, DeepSeek's) or
  where EP x TP does not fit its TP x CP x DP GPUs, so that megatron-core's default (etp = tp)
  would be refused. megatron-core's MoE README (Megatron-LM `megatron/core/transformer/moe/
  README.md`, d98e8a64dd) gives etp's default as tp and recommends 1 for fine-grained MoE
  models, and every fine-grained run with TP in bench/published_runs.py set 1 (Megatron-LM's and
  Megatron-Bridge's Qwen3 recipes, the MoE ModelZoo's Qwen3-235B layouts), whose published
  figures the ModelZoo's long-context rows given without etp read 45-55% too slow at etp = tp.
  Wider experts (Mixtral's) keep etp = tp.
- The code of an FP16 run. Megatron-LM trained in FP16 until BF16 came in 2021-03 (commit
  b4bc51b1e7) and had no flash attention until 2022-12 (d693034ecf); NVIDIA's FP16 runs on
  A100 (Narayanan et al. 2021, Korthikanti et al. 2022, the README's GPT-3 175B) and V100 ran
  that code, and its recipes since run BF16 or FP8. So an FP16 run that uses nothing that
  code lacked (no distributed optimizer, context parallelism or experts, which came with
  megatron-core and Transformer Engine's attention) takes the settings of Megatron-LM of 2021
  (`FP16_SOFTWARE`, `gradbuffer`, `tpcomm`) and no sequence parallelism (2022-05) for those
  it leaves unset; a run that sets them keeps its own.
"""

from __future__ import annotations

from typing import Any

from megatron_lgs.lgs.workload import SPLIT_FIELDS, SplitError, layer_split

# Megatron-LM of 2021: unfused attention (its fused scale-mask-softmax), FP16 gradients in
# param.grad (no FP32 main-gradient buffer), its "local" DDP reducing after the backward, the
# TP all-reduce blocking in autograd, pipeline sends scattered over the TP group and not
# overlapped, tied input and output embeddings.
FP16_SOFTWARE = {"flash_attention": False, "grad_buffer": False, "overlap_grad_reduce": False,
                 "tp_async_backward": False, "p2p_scatter_gather": True,
                 "overlap_p2p_comm": False, "untie_embeddings": False}


def _splits(num_layers: int, pp: int, vpp: int) -> list[dict[str, Any]]:
    """The candidate splits in order: even, the embedding and loss counted (both, the loss
    alone, the embedding alone), a lighter last stage, then lighter (or, where the stages in
    between cannot take fewer, heavier) first and last stages around the even share rounded
    up that leaves them a chunk each."""
    out: list[dict[str, Any]] = [{}, {SPLIT_FIELDS[2]: True, SPLIT_FIELDS[3]: True},
                                 {SPLIT_FIELDS[3]: True}, {SPLIT_FIELDS[2]: True}]
    share = vpp * -(-num_layers // (pp * vpp))  # layers a stage, rounded up to whole chunks
    if (last := num_layers - (pp - 1) * share) >= 1:
        out.append({SPLIT_FIELDS[1]: last})
    for middle in range(share, 0, -vpp):
        ends = num_layers - (pp - 2) * middle
        if ends >= 2 * vpp:
            first = vpp * (ends // (2 * vpp))
            out.append({SPLIT_FIELDS[0]: first, SPLIT_FIELDS[1]: ends - first})
            break
    return out


def pipeline_split_for(num_layers: int, pp: int, vpp: int) -> dict[str, Any]:
    """The split fields of the first split in `_splits` that megatron-core accepts; the even
    split's SplitError when none does."""
    first_error = None
    for split in _splits(num_layers, pp, vpp):
        try:
            layer_split(num_layers, pp, vpp, split.get(SPLIT_FIELDS[0], 0),
                        split.get(SPLIT_FIELDS[1], 0), split.get(SPLIT_FIELDS[2], False),
                        split.get(SPLIT_FIELDS[3], False))
        except SplitError as e:
            first_error = first_error or e
            continue
        return split
    raise first_error


def fine_grained_moe(expert_ffn: int, hidden: int) -> bool:
    """Experts narrower than the hidden size (Qwen3's, DeepSeek's; not Mixtral's)."""
    return expert_ffn < hidden


def assume(vals: dict[str, Any]) -> dict[str, Any]:
    """The fields `vals` (a run's given and defaulted fields, `runspec.read_run`, dp included)
    leaves unset that are read from the run: its pipeline split, its experts' TP and an FP16
    run's software. Raises SplitError where no split fits."""
    out: dict[str, Any] = {}
    if not any(f in vals for f in SPLIT_FIELDS):
        out.update(pipeline_split_for(vals["num_layers"], vals["pp"], vals.get("vpp", 1)))
    if "etp" not in vals and vals.get("num_experts") and vals["tp"] > 1:
        ep, width = vals.get("ep", 1), vals["tp"] * vals.get("cp", 1) * vals["dp"]
        fine = fine_grained_moe(vals.get("moe_ffn_hidden", vals["ffn_hidden"]), vals["hidden"])
        if fine or (width % (ep * vals["tp"]) and not width % ep):
            out["etp"] = 1
    later = vals.get("distributed_optimizer") or vals.get("zero") or vals.get("cp", 1) > 1 \
        or vals.get("num_experts")
    if vals["precision"] == "fp16" and not later:
        software = {**FP16_SOFTWARE, "sequence_parallel": False}
        out.update({k: v for k, v in software.items() if k not in vals})
    return out
