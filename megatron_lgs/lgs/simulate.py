"""Threshold-grid search over predicted step times; `python -m megatron_lgs.lgs.simulate`.

`python -m megatron_lgs.lgs.simulate predict RUNS.json` predicts whole training steps instead
(the whole-step model, `stepmodel`; see `predict`).

Every number printed is a prediction of the cost model (see `timeline` for how a step is
modelled), not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from megatron_lgs.lgs.costmodel import custom
from megatron_lgs.lgs.gpus import PROFILES, get_profile
from megatron_lgs.lgs.grid import GRID_MB, GridResult, preference, sweep  # noqa: F401
from megatron_lgs.lgs.simreport import LABEL, grid_table, write_heatmap, write_trace
from megatron_lgs.lgs.timeline import MB, Workload
from megatron_lgs.lgs.workload import Layout, ModelConfig

# The seed's case: ~100B dense GPT (GPT-3 shape, 12*L*h^2 = 100.7B) on 128 A100 in TP8 PP4 DP4.
PRESETS: dict[str, tuple[ModelConfig, Layout]] = {
    "gpt-100b": (
        ModelConfig(num_layers=80, hidden=10240, ffn_hidden=40960, num_heads=80, vocab=51200,
                    seq_length=2048),
        Layout(tp=8, pp=4, dp=4, gpus_per_node=8, num_micro_batches=128),
    ),
    # launch/configs/gpt-10b.sh at 64 GPUs (DP8), global batch 512.
    "gpt-10b": (
        ModelConfig(num_layers=40, hidden=5120, ffn_hidden=13824, num_heads=40, vocab=32000,
                    seq_length=4096, num_query_groups=8, swiglu=True),
        Layout(tp=4, pp=2, dp=8, gpus_per_node=8, num_micro_batches=64,
               distributed_optimizer=True),
    ),
    # launch/configs/gpt-100b-moe.sh at 128 GPUs (DP8), global batch 1024.
    "gpt-100b-moe": (
        ModelConfig(num_layers=48, hidden=4096, ffn_hidden=14336, num_heads=32, vocab=32000,
                    seq_length=4096, num_query_groups=8, swiglu=True, num_experts=64,
                    moe_topk=2, moe_ffn_hidden=2560),
        Layout(tp=2, pp=8, dp=8, ep=8, etp=2, gpus_per_node=8, num_micro_batches=128,
               distributed_optimizer=True),
    ),
}


def explain(w: Workload, r: GridResult) -> list[str]:
    """Why the optimum lies where it does, in the model's own terms."""
    lay, crit = w.layout, r.best.stages[r.best.critical_stage]
    g, m = lay.group_shape("dense")
    grad = sum(b.nbytes for b in crit.buckets)
    bwd = crit.backward_end_s - crit.ops[0].start_s if crit.ops else 0.0
    lines = [f"dense DP group: {g} rank(s)/node x {m} node(s); grads per GPU {grad / 1e9:.2f} GB; "
             f"last backward {bwd * 1e3:.0f} ms vs grad sync {crit.comm_s * 1e3:.0f} ms"]
    if g == 1:
        lines.append("TP fills the node, so no DP traffic stays inside it: the intra threshold "
                     "only groups tensors, and every byte crosses the inter-node link.")
    column = [p for p in r.predictions
              if p.thresholds.inter_bytes == r.best.thresholds.inter_bytes]
    plans = {tuple(b.tensors for s in p.stages for b in s.buckets) for p in column}
    if w.weighting != "none" and len(plans) < len(column):
        lines.append(f"buckets close at layer boundaries (--lgs-layer-weighting {w.weighting}): "
                     f"the grid's {len(column)} intra thresholds make {len(plans)} different "
                     f"plan(s), a layer's gradients exceeding the rest; ties go to the smallest.")
    if crit.comm_s > bwd:
        lines.append("communication-bound: sync outlasts the last backward, so fewer, larger "
                     "messages (less latency) win and the smallest tail matters little.")
    lines.append("alpha-beta has no term that rewards small inter-node messages (NIC queueing, "
                 "incast); such a preference must come from measurement (the online tuner).")
    return lines


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m megatron_lgs.lgs.simulate", description=__doc__)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpt-100b")
    for f in ("num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads",
              "vocab-size", "seq-length", "num-query-groups", "num-experts", "moe-router-topk",
              "moe-ffn-hidden-size"):
        ap.add_argument(f"--{f}", type=int)
    for f in ("tp", "pp", "dp", "ep", "etp", "gpus-per-node", "micro-batch-size",
              "num-micro-batches"):
        ap.add_argument(f"--{f}", type=int)
    ap.add_argument("--distributed-optimizer", action="store_true")
    ap.add_argument("--hardware", choices=[*sorted(PROFILES), "custom"], default="a100-hdr")
    ap.add_argument("--intra-bw-gbps", type=float, help="custom: intra bus bandwidth, GB/s")
    ap.add_argument("--inter-bw-gbps", type=float, help="custom: inter bus bandwidth, GB/s")
    ap.add_argument("--intra-alpha-us", type=float, help="custom: intra latency (default 3)")
    ap.add_argument("--inter-alpha-us", type=float, help="custom: inter latency (default 15)")
    ap.add_argument("--peak-tflops", type=float, help="custom: peak TFLOP/s (default 312)")
    ap.add_argument("--gpu-memory-gb", type=float, help="custom: GPU memory (default 80)")
    ap.add_argument("--efficiency", type=float,
                    help="compute at this fraction of peak FLOP/s (default: the GPU's kernel "
                         "model; 0.5 on --hardware custom)")
    ap.add_argument("--grid-mb", default=",".join(map(str, GRID_MB)))
    ap.add_argument("--out-dir", type=Path, default=Path("lgs_sim_out"))
    return ap.parse_args(argv)


# The flags that describe a --hardware custom profile -> `costmodel.custom`'s arguments.
CUSTOM_FLAGS = {"--intra-bw-gbps": "intra_bw_GBps", "--inter-bw-gbps": "inter_bw_GBps",
                "--intra-alpha-us": "intra_alpha_us", "--inter-alpha-us": "inter_alpha_us",
                "--peak-tflops": "peak_tflops", "--gpu-memory-gb": "memory_GB"}


def _workload(a: argparse.Namespace) -> Workload:
    model, lay = PRESETS[a.preset]
    names = {"num_layers": "num_layers", "hidden_size": "hidden", "ffn_hidden_size": "ffn_hidden",
             "num_attention_heads": "num_heads", "vocab_size": "vocab",
             "seq_length": "seq_length", "num_query_groups": "num_query_groups",
             "num_experts": "num_experts", "moe_router_topk": "moe_topk",
             "moe_ffn_hidden_size": "moe_ffn_hidden"}
    model = replace(model, **{v: getattr(a, k) for k, v in names.items()
                              if getattr(a, k) is not None})
    lay_keys = ("tp", "pp", "dp", "ep", "etp", "gpus_per_node", "micro_batch_size",
                "num_micro_batches")
    lay = replace(lay, **{k: getattr(a, k) for k in lay_keys if getattr(a, k) is not None})
    if a.distributed_optimizer:
        lay = replace(lay, distributed_optimizer=True)
    given = {flag: getattr(a, flag[2:].replace("-", "_")) for flag in CUSTOM_FLAGS}
    given = {flag: value for flag, value in given.items() if value is not None}
    if a.hardware == "custom":
        if a.intra_bw_gbps is None or a.inter_bw_gbps is None:
            raise ValueError("--hardware custom needs --intra-bw-gbps and --inter-bw-gbps")
        hw = custom(gpus_per_node=lay.gpus_per_node, **{
            CUSTOM_FLAGS[flag]: value for flag, value in given.items()})
    elif given:  # a named profile has its own constants: such a flag would change nothing
        raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} "
                         f"only to --hardware custom; {a.hardware} has its own constants")
    else:
        hw = get_profile(a.hardware)
    return Workload(model, lay, hw, a.efficiency)


def main(argv: list[str] | None = None) -> GridResult:
    a = _parse(argv)
    try:
        w = _workload(a)
        try:
            grid = [int(x) for x in a.grid_mb.split(",")]
        except ValueError:
            raise ValueError(f"--grid-mb takes comma-separated MB integers, got "
                             f"{a.grid_mb!r}") from None
        try:  # before the sweep, not after it
            a.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--out-dir {a.out_dir}: {e.strerror}") from None
        r = sweep(w, grid)
    except ValueError as e:  # a layout or model the grid cannot simulate: one line, exit 2
        print(f"simulate: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    lay = w.layout
    print(f"# {LABEL}")
    print(f"# {a.preset} on {lay.world} x {w.hw.name}: TP{lay.tp} PP{lay.pp} DP{lay.dp} "
          f"EP{lay.ep}, {lay.gpus_per_node} GPUs/node, M={lay.num_micro_batches}, "
          f"compute: {w.compute_label}")
    print(grid_table(list(r.predictions)))
    b = r.best
    print(f"best (predicted): intra {b.thresholds.intra_bytes // MB} MB, inter "
          f"{b.thresholds.inter_bytes // MB} MB: step {b.step_time_s:.4f} s, exposed "
          f"{b.exposed_comm_s * 1e3:.1f} ms, comm {b.comm_fraction:.1%}, idle "
          f"{b.gpu_idle_fraction:.1%}")
    for line in explain(w, r):
        print(f"why: {line}")
    wall = r.wall
    top = wall.largest_on_grid([g * MB for g in grid])
    print(f"memory wall (predicted): states {wall.states_bytes / 1e9:.1f} GB + activations "
          f"{wall.activation_bytes / 1e9:.1f} GB of {wall.memory_bytes / 1e9:.0f} GB -> largest "
          f"threshold {wall.largest_threshold_bytes / 1e9:.2f} GB "
          f"(grid: {'none fits' if top is None else f'{top // MB} MB'})")
    write_heatmap(list(r.predictions), grid, a.out_dir / "lgs_heatmap.png", a.preset)
    write_trace(b, a.out_dir / "lgs_best_trace.json")
    print(f"wrote {a.out_dir / 'lgs_heatmap.png'} and {a.out_dir / 'lgs_best_trace.json'}")
    return r


def cli(argv: list[str]) -> int:
    """`simulate predict RUNS.json` (the whole-step model) or the threshold-grid simulator."""
    if argv[:1] == ["predict"]:
        from megatron_lgs.lgs.predict import main as predict_main

        return predict_main(argv[1:])
    main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
