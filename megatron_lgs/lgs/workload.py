"""What one GPU computes and synchronizes: per-stage backward ops, gradient tensors, states.

Conventions (Megatron): TP is the innermost rank dimension, then DP, then PP; experts are
sharded EP-ways with expert-TP `etp`, their gradients reduced over the expert-DP group
(tp*dp/(ep*etp) ranks). Linear layers are bias-free; routing is assumed balanced.
"""

from __future__ import annotations

from dataclasses import dataclass

DENSE = "dense"
EXPERT = "expert"


@dataclass(frozen=True)
class ModelConfig:
    """A GPT (num_experts == 0) or MoE transformer."""

    num_layers: int
    hidden: int
    ffn_hidden: int
    num_heads: int
    vocab: int
    seq_length: int = 2048
    num_query_groups: int | None = None
    swiglu: bool = False
    num_experts: int = 0
    moe_topk: int = 2
    moe_ffn_hidden: int | None = None
    untie_embeddings: bool = True
    kv_channels: int | None = None  # width of one attention head; None: hidden / num_heads

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden", "ffn_hidden", "num_heads", "vocab", "seq_length"):
            if getattr(self, f) < 1:
                raise ValueError(f"ModelConfig.{f} must be >= 1, got {getattr(self, f)}")
        if self.kv_channels is None and self.hidden % self.num_heads:
            raise ValueError(f"hidden {self.hidden} not divisible by heads {self.num_heads}")
        bad_topk = self.num_experts and not 1 <= self.moe_topk <= self.num_experts
        if self.num_experts < 0 or bad_topk:
            raise ValueError("need num_experts >= 0 and 1 <= moe_topk <= num_experts")

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return (self.num_query_groups or self.num_heads) * self.head_dim

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden


@dataclass(frozen=True)
class Layout:
    """Parallel layout, batch schedule and precision of the run."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    gpus_per_node: int = 8
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    param_bytes: int = 2
    # Megatron accumulates and reduces bf16 gradients in fp32 by default.
    grad_bytes: int = 4
    distributed_optimizer: bool = False
    # Megatron-core's uneven pipeline splits (`layer_split`; SPLIT_FIELDS, Megatron-LM's names):
    # the layers of the first and last stage (0: the even share), or the embedding and the loss
    # counted as one layer each of the first and last stage.
    decoder_first_pipeline_num_layers: int = 0
    decoder_last_pipeline_num_layers: int = 0
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "ep", "etp", "gpus_per_node", "micro_batch_size",
                  "num_micro_batches", "param_bytes", "grad_bytes"):
            if getattr(self, f) < 1:
                raise ValueError(f"Layout.{f} must be >= 1, got {getattr(self, f)}")
        if (self.tp * self.dp) % (self.ep * self.etp):
            raise ValueError(f"ep*etp={self.ep * self.etp} must divide tp*dp={self.tp * self.dp}")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        return self.tp * self.dp // (self.ep * self.etp)

    def group_shape(self, group: str) -> tuple[int, int]:
        """(ranks of this gradient group per node g, nodes m) for a DP or expert-DP group."""
        size, inner = (self.dp, self.tp) if group == DENSE else (self.expert_dp, self.ep * self.etp)
        g = group_ranks_per_node(size, inner, self.gpus_per_node)
        if g is None:
            raise ValueError(f"{group} DP group of {size} does not fill nodes of "
                             f"{self.gpus_per_node} evenly")
        return g, size // g


def group_ranks_per_node(size: int, inner: int, gpus_per_node: int) -> int | None:
    """Ranks of a data-parallel group of `size` on each of its nodes, `inner` GPUs (its TP, or
    expert TP x EP, block) apart; None where the group does not fill its nodes evenly."""
    g = max(1, min(size, gpus_per_node // inner))
    return None if size % g else g


@dataclass(frozen=True)
class GradTensor:
    name: str
    numel: int
    group: str


@dataclass(frozen=True)
class BackwardOp:
    """One backward op on one GPU, its FLOPs, and the gradients ready when it ends."""

    name: str
    flops: float
    grads: tuple[GradTensor, ...]


def _layer_backward(model: ModelConfig, lay: Layout, i: int) -> list[BackwardOp]:
    h, t = model.hidden, lay.tp
    tok = lay.micro_batch_size * model.seq_length
    mlp_mats = 3 if model.swiglu else 2
    fc1_width = 2 if model.swiglu else 1
    p = f"layer{i}."
    ops: list[BackwardOp] = []
    if model.num_experts:
        ffn = model.expert_ffn
        local = model.num_experts // lay.ep
        experts = tuple(
            GradTensor(f"{p}expert{e}.{w}", h * ffn * k // lay.etp, EXPERT)
            for e in range(local) for w, k in (("fc2", 1), ("fc1", fc1_width))
        )
        # Backward is 2x forward; balanced routing spreads topk expert FLOPs over the TP group.
        mlp_flops = 2 * 2 * tok * h * ffn * mlp_mats * model.moe_topk / t
        ops.append(BackwardOp(f"{p}experts", mlp_flops, experts))
        router = GradTensor(f"{p}router", h * model.num_experts, DENSE)
        ops.append(BackwardOp(f"{p}router", 2 * 2 * tok * h * model.num_experts / t, (router,)))
    else:
        ffn = model.ffn_hidden
        ops.append(BackwardOp(f"{p}fc2", 2 * 2 * tok * h * ffn / t,
                              (GradTensor(f"{p}fc2", h * ffn // t, DENSE),)))
        ops.append(BackwardOp(f"{p}fc1", 2 * 2 * tok * h * ffn * fc1_width / t,
                              (GradTensor(f"{p}fc1", h * ffn * fc1_width // t, DENSE),
                               GradTensor(f"{p}ln2", h, DENSE))))
    q = model.q_dim
    ops.append(BackwardOp(f"{p}proj", 2 * 2 * tok * h * q / t,
                          (GradTensor(f"{p}proj", h * q // t, DENSE),)))
    # QK^T and AV, counted over the full (not causal-halved) score matrix, as Megatron does.
    ops.append(BackwardOp(f"{p}core_attn", 2 * 4 * tok * model.seq_length * q / t, ()))
    qkv = h * (q + 2 * model.kv_dim)
    ops.append(BackwardOp(f"{p}qkv", 2 * 2 * tok * qkv / t,
                          (GradTensor(f"{p}qkv", qkv // t, DENSE),
                           GradTensor(f"{p}ln1", h, DENSE))))
    return ops


def layer_backward_flops(model: ModelConfig, lay: Layout) -> float:
    """Backward FLOPs of one transformer layer for one micro-batch on one GPU."""
    return sum(op.flops for op in _layer_backward(model, lay, 0))


# The pipeline-split fields, named alike in the trainer's ParallelConfig, runspec.Run and Layout.
SPLIT_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def pipeline_split(obj: object) -> dict[str, int | bool]:
    """The SPLIT_FIELDS of a ParallelConfig, Run or Layout (an unset layer count: 0), in the
    order of `layer_split`'s arguments."""
    return {f: (getattr(obj, f) or 0) if "num_layers" in f else bool(getattr(obj, f))
            for f in SPLIT_FIELDS}


class SplitError(ValueError):
    """A pipeline split megatron-core refuses; `field` names the Layout field to blame."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field


def layer_split(num_layers: int, pp: int, vpp: int = 1, first: int = 0, last: int = 0,
                embedding: bool = False, loss: bool = False) -> list[list[int]]:
    """Transformer layers of each model chunk, [stage][chunk], as megatron-core 0.16's
    `get_num_layers_to_build` assigns them (`Layout`'s split fields); raises SplitError where
    it would assert."""
    if first or last:
        if embedding or loss:
            raise SplitError(SPLIT_FIELDS[0], "uneven first/last stages cannot be combined "
                             "with the embedding or loss counted in the split")
        if pp == 1:
            raise SplitError(SPLIT_FIELDS[0], "uneven first/last stages need pp > 1")
        rest, left = num_layers - first - last, pp - bool(first) - bool(last)
        if rest < 0 or (left and rest % left) or (not left and rest):
            raise SplitError("num_layers", f"num_layers {num_layers} minus the first/last "
                             f"stages' {first + last} does not split evenly over the other "
                             f"{left} stage(s)")
        stages = [rest // left if left else 0] * pp
        stages[0] = first or stages[0]
        stages[-1] = last or stages[-1]
    else:
        total = num_layers + embedding + loss
        if total % pp:
            extra = " (with the embedding/loss counted)" if total != num_layers else ""
            raise SplitError("num_layers", f"num_layers {total}{extra} not divisible by pp {pp} "
                             "(an uneven split sets the first/last stage's layers or counts the "
                             "embedding and loss)")
        stages = [total // pp] * pp
    if any(n % vpp for n in stages):
        raise SplitError("vpp", f"stage layers {sorted(set(stages))} not divisible by vpp {vpp}")
    chunks = [[n // vpp] * vpp for n in stages]
    chunks[0][0] -= embedding
    chunks[-1][-1] -= loss
    if min(chunks[0][0], chunks[-1][-1]) < 0:
        raise SplitError("num_layers", "a chunk holding the embedding or loss has no layer left")
    return chunks


def layout_split(model: ModelConfig, lay: Layout, vpp: int = 1) -> list[list[int]]:
    return layer_split(model.num_layers, lay.pp, vpp, *pipeline_split(lay).values())


def _layer_ranges(model: ModelConfig, lay: Layout, stage: int, vpp: int) -> list[range]:
    """The layers of each chunk of `stage`; layers are numbered chunk-major, as in Megatron
    (chunk 0 of every stage, then chunk 1, ...)."""
    split = layout_split(model, lay, vpp)
    out = []
    for c in range(vpp):
        start = sum(split[k][j] for j in range(c) for k in range(lay.pp))
        start += sum(split[k][c] for k in range(stage))
        out.append(range(start, start + split[stage][c]))
    return out


def _check_stage(model: ModelConfig, lay: Layout, stage: int, vpp: int = 1) -> None:
    layout_split(model, lay, vpp)
    if model.num_experts % lay.ep:
        raise ValueError(f"num_experts {model.num_experts} not divisible by ep {lay.ep}")
    if not 0 <= stage < lay.pp:
        raise ValueError(f"stage {stage} outside [0, {lay.pp})")


def _backward(model: ModelConfig, lay: Layout, layers: range, first: bool, last: bool
              ) -> list[BackwardOp]:
    """Backward ops of a contiguous run of layers, with the output layer if `last` and the
    embedding if `first`, in execution order."""
    h, tok = model.hidden, lay.micro_batch_size * model.seq_length
    emb = model.vocab * h // lay.tp
    ops: list[BackwardOp] = []
    if last:
        out = (GradTensor("output", emb, DENSE),) if model.untie_embeddings or lay.pp > 1 else ()
        ops.append(BackwardOp("output", 2 * 2 * tok * h * model.vocab / lay.tp,
                              out + (GradTensor("final_ln", h, DENSE),)))
    for i in reversed(layers):
        ops.extend(_layer_backward(model, lay, i))
    if first:
        # The embedding gradient is a scatter-add: negligible FLOPs, ready last.
        ops.append(BackwardOp("embedding", 0.0, (GradTensor("embedding", emb, DENSE),)))
    return ops


def stage_backward(model: ModelConfig, lay: Layout, stage: int) -> list[BackwardOp]:
    """Backward ops of one pipeline stage for one micro-batch, in execution order."""
    _check_stage(model, lay, stage)
    return _backward(model, lay, _layer_ranges(model, lay, stage, 1)[0], stage == 0,
                     stage == lay.pp - 1)


def chunk_backward(model: ModelConfig, lay: Layout, stage: int, vpp: int
                   ) -> list[list[BackwardOp]]:
    """Backward ops of one stage under the interleaved schedule, per model chunk: stage k
    holds chunks c = 0 .. vpp-1 (evenly split: layers [(c pp + k) L, (c pp + k + 1) L),
    L = layers / (pp vpp); else as `layer_split` says). Chunks are listed in the order their
    last backward runs (chunk vpp-1 first), each chunk's ops in execution order."""
    _check_stage(model, lay, stage, vpp)
    ranges = _layer_ranges(model, lay, stage, vpp)
    return [_backward(model, lay, ranges[c], stage == 0 and c == 0,
                      stage == lay.pp - 1 and c == vpp - 1) for c in reversed(range(vpp))]


def forward_flops(ops: list[BackwardOp]) -> float:
    """Forward FLOPs of a stage: half of its backward (no recomputation)."""
    return sum(op.flops for op in ops) / 2


def stage_numel(ops: list[BackwardOp]) -> dict[str, int]:
    """Parameter count per gradient group held by one GPU of the stage."""
    out = {DENSE: 0, EXPERT: 0}
    for op in ops:
        for g in op.grads:
            out[g.group] += g.numel
    return out
