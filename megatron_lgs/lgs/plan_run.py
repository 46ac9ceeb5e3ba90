"""Layout planner: the fastest layouts of a model on N GPUs that fit in memory, predicted.

`python -m megatron_lgs.lgs.plan_run --model CONFIG --gpus N --hardware PROFILE
--global-batch B [--seq-length S] [--gpus-per-node G] [--nic-gbit-per-gpu S] [--json FILE]`.

CONFIG is a simulator preset (`gpt-100b`, `gpt-10b`, `gpt-100b-moe`; a bare name is a preset
first), a launch config (`launch/configs/gpt-10b.sh`, or a name that is no preset), or a
Hugging Face model (a folder with its config.json, or that file; with `--seq-length` and
`--global-batch`, which such a config lacks; `plan_models`); a launch config's own layout, when
it has one for N GPUs, is predicted beside the planner's best. PROFILE is a GPU of
`megatron_lgs/lgs/gpus.py`. Prints the fastest layouts that fit in memory with predicted step,
MFU, memory and LGS thresholds, a flag line for the best, and the answers to: ZeRO-2 against
ZeRO-3, TP inside or across nodes, what a slower inter-node network costs, for an MoE the EP
all-to-all overlap on or off, how much the bucket thresholds move the step. Every number is a
prediction of the whole-step model (`stepmodel`). `--json FILE` writes the same as
one JSON object (`plan_record`); each plan's `run` is a run `simulate predict` takes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from megatron_lgs.lgs.gpus import GPUS, get_gpu
from megatron_lgs.lgs.grid import GRID_MB
from megatron_lgs.lgs.plan_models import best_flags, resolve
from megatron_lgs.lgs.planner import (
    Candidate,
    Plan,
    best_of,
    candidates,
    layouts,
    lgs_applies,
    memory,
    threshold_sweep,
    with_thresholds,
)
from megatron_lgs.lgs.predict import prediction_record
from megatron_lgs.lgs.run_defaults import fine_grained_moe
from megatron_lgs.lgs.runcheck import fills_nodes
from megatron_lgs.lgs.runspec import Run, run_to_dict
from megatron_lgs.lgs.stepmodel import StepEstimate, predict_run
from megatron_lgs.value_checks import unwritable_file

LABEL = "PREDICTION (whole-step model, not a measurement)"
# What bench/published_runs.py shows on Hopper (README, "Published runs").
HOPPER = ("h100-sxm", "h800", "h200")
HOPPER_CAVEAT = ("Hopper: 80 of the 83 published H100 runs of bench/published_runs.py "
                 "(2023-2026, BF16 and FP8) were slower than this model predicts, by a median "
                 "11% (BF16 8%, FP8 12%), and all 3 H200 runs (2025, FP8) by 5-11%; NVIDIA's "
                 "recipes of 2024 that ran in both precisions gained 3-14% less from FP8 than "
                 "it predicts. Their GEMM and "
                 "attention kernels, measured on an H200, run at its times "
                 "(bench/measured/h200-2026-12-04); of the three it predicts slower, two are "
                 "long-context runs, attention 65-79% of the step, and one a Llama 3 8B under "
                 "Megatron-FSDP with recompute (-5%). NVIDIA's tuned MLPerf GPT-3 "
                 "of 2024-11 ran within 3% of it on 256 and 512 GPUs; that of 2023-11, from "
                 "512 to 10752 GPUs, paid ~30 ms a step less than it predicts besides its "
                 "micro-batches, and its Llama 3.1 405B of 2025-06, from 512 to 8192 GPUs, "
                 "~180 ms a step more (from 512 to 2048 GPUs ~160 ms a step; the same software "
                 "on 512 and 1024 H200 at TP4 ~40 ms a step). Do not take its MFU as "
                 "a promise, and rank layouts by it with care: of one MoE model's published H100 "
                 "layouts (Qwen3-235B) it orders 4 of 9 pairs as measured")
# What bench/published_runs.py shows for MoE: experts wider than the hidden size (Mixtral's)
# read like the dense rows; narrower ones read further off, and differently by release.
FINE_MOE_CAVEAT = ("MoE with experts narrower than the hidden size: of the published runs of "
                   "bench/published_runs.py, Qwen3-30B-A3B and Qwen3-235B-A22B on Megatron-LM's "
                   "recipes of 2026 ran 1.3x and 1.8x slower than this model predicts, on "
                   "Megatron-Bridge 25.11 1.2x (235B) and 3.3x (30B): the software moves these "
                   "runs more than the model's terms do")
# What bench/published_runs.py shows of the EP all-to-all overlap: the one published pair of
# runs with and without it, at one layout on one cluster ("ranking layouts").
A2A_OVERLAP_EVIDENCE = ("the one published pair with and without it at one layout (Qwen3-235B "
                        "on 256 H100, Megatron-MoE-ModelZoo, bench/published_runs.py) ran 1.12x "
                        "faster with it, where this model predicts 1.37x: try the layout "
                        "without it too")
ROW_GRID_MB = [16, 64, 256]


def caveats(hardware: str, base: Run) -> list[str]:
    """Where the published runs say this model's figures are not predictions."""
    out = [HOPPER_CAVEAT] if hardware in HOPPER else []
    if base.num_experts and fine_grained_moe(base.expert_ffn, base.hidden):
        out.append(FINE_MOE_CAVEAT)
    return out


def describe(r: Run) -> str:
    """A layout in one short line; an uneven pipeline shows its stages' layer range."""
    stages = r.stage_layers
    split = f"({min(stages)}-{max(stages)})" if min(stages) != max(stages) else ""
    lay = f"TP{r.tp} PP{r.pp}{split}" + (f" V{r.vpp}" if r.vpp > 1 else "") + \
        (f" CP{r.cp}" if r.cp > 1 else "") + (f" EP{r.ep}" if r.ep > 1 else "") + \
        (f" ETP{r.etp}" if r.num_experts and r.etp != r.tp else "") + \
        (f" {r.moe_dispatcher}" if r.num_experts and r.moe_dispatcher != "alltoall" else "") + \
        (" A2A-overlap" if r.moe_a2a_overlap else "") + f" DP{r.dp}"
    return f"{lay} mb{r.micro_batch} {r.recompute} ZeRO-{r.zero}"


def row(i: int | str, p: Plan) -> str:
    e = p.estimate
    lgs = (f"{p.thresholds_mb[0]:>5}/{p.thresholds_mb[1]:<5} {p.threshold_step_s:>8.3f} "
           f"{p.grid_spread:>7.2%}" if p.thresholds_mb else f"{'-':>11} {'-':>8} {'-':>7}")
    return (f"{i!s:>4} {describe(e.run):<48} {e.step_time_s:>8.3f} {e.mfu:>6.1%} "
            f"{e.memory.peak_bytes / 1e9:>6.1f} {lgs}")


def _vs(a: StepEstimate | None, b: StepEstimate | None, what_a: str, what_b: str,
        unfit: Callable[[str], bool]) -> str:
    """`a` against `b`; where one is missing, whether its kind was refused for memory
    (`unfit(what)`) or no layout of that kind divides the model, GPUs and batch at all."""
    if a is None or b is None:
        missing = what_a if a is None else what_b
        if unfit(missing):
            return f"no {missing} layout fits in memory"
        return f"no {missing} layout divides this model, GPU count and global batch"
    faster = what_a if a.step_time_s <= b.step_time_s else what_b
    ratio = max(a.step_time_s, b.step_time_s) / min(a.step_time_s, b.step_time_s)
    # "faster by 2070.7%" reads worse than "21.71x faster" once one is twice the other.
    by = f"{ratio:.2f}x faster" if ratio >= 2 else f"faster by {ratio - 1:.1%}"
    return (f"{what_a} {describe(a.run)} {a.step_time_s:.3f} s vs {what_b} {describe(b.run)} "
            f"{b.step_time_s:.3f} s: {faster} {by}")


def _first(xs: list[StepEstimate]) -> StepEstimate | None:
    return xs[0] if xs else None


def questions(cands: list[Candidate], best: StepEstimate, base: Run, unfit: Sequence[Run] = (),
              known: dict[Run, StepEstimate] | None = None) -> list[str]:
    """The seeds' questions, answered on `cands` (`planner.candidates`; `unfit`: the layouts
    it left out for memory; `known`: predictions already made, see `planner.best_of`)."""
    def vs(what_a: str, what_b: str, where_a: Callable[[Run], bool],
           where_b: Callable[[Run], bool]) -> str:
        kinds = {what_a: where_a, what_b: where_b}
        return _vs(_first(best_of(cands, 1, where_a, known)),
                   _first(best_of(cands, 1, where_b, known)), what_a, what_b,
                   lambda what: any(kinds[what](r) for r in unfit))

    def pure(r: Run) -> bool:
        return (r.tp, r.pp, r.cp, r.ep) == (1, 1, 1, 1)

    gpn = base.gpus_per_node
    out = ["ZeRO-2 vs ZeRO-3 (pure data parallel): "
           + vs("ZeRO-2", "ZeRO-3", lambda r: pure(r) and r.zero == 2,
                lambda r: pure(r) and r.zero == 3)]
    if base.num_gpus <= gpn:
        out.append(f"TP inside a node (<= {gpn}) vs across: none crosses one, "
                   f"{_one_node(base.num_gpus)}")
    else:
        out.append(f"TP inside a node (<= {gpn}) vs across: "
                   + vs("inside", "across", lambda r: r.tp <= gpn, lambda r: r.tp > gpn))
    out.append(_slower_network(best, base))
    if base.num_experts:
        out.append("EP all-to-all overlap on vs off: "
                   + vs("on", "off", lambda r: r.moe_a2a_overlap,
                        lambda r: not r.moe_a2a_overlap)
                   + f"; {A2A_OVERLAP_EVIDENCE}")
    return out


def _one_node(num_gpus: int) -> str:
    return "the one GPU" if num_gpus == 1 else f"the {num_gpus} GPUs share a node"


def _slower_network(best: StepEstimate, base: Run) -> str:
    if base.num_gpus <= base.gpus_per_node:
        return f"slower inter-node network: none crosses one, {_one_node(base.num_gpus)}"
    nic = get_gpu(best.run.gpu).nic_gbit_per_gpu if best.run.nic_gbit_per_gpu is None \
        else best.run.nic_gbit_per_gpu
    slow = []
    for f in (2, 4):
        e = predict_run(replace(best.run, nic_gbit_per_gpu=nic / f))
        cost = e.step_time_s / best.step_time_s - 1
        slow.append(f"{nic / f:g} Gb/s {e.step_time_s:.3f} s ({cost:+.1%})")
    return (f"slower inter-node network, best layout at {nic:g} Gb/s per GPU "
            f"{best.step_time_s:.3f} s: " + ", ".join(slow))


def plan_record(spec: str, base: Run, p: Plan) -> dict:
    """One plan as JSON: its run (a `simulate predict` input), the prediction, LGS's
    thresholds and the trainer's flags for it."""
    return {"run": run_to_dict(p.run), **prediction_record(p.estimate),
            "lgs_thresholds_mb": list(p.thresholds_mb) if p.thresholds_mb else None,
            "lgs_step_time_s": round(p.threshold_step_s, 6) if p.thresholds_mb else None,
            "lgs_grid_spread": p.grid_spread, "flags": best_flags(spec, base, p)}


def main(argv: list[str] | None = None) -> list[Plan]:
    ap = argparse.ArgumentParser(prog="python -m megatron_lgs.lgs.plan_run",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True,
                    help="simulator preset, launch config, or Hugging Face config (a folder "
                         "with config.json, or the file)")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--hardware", choices=sorted(GPUS), required=True)
    ap.add_argument("--global-batch", type=int, help="sequences (default: the config's)")
    ap.add_argument("--seq-length", type=int,
                    help="tokens a sequence (a Hugging Face config's training length)")
    ap.add_argument("--nic-gbit-per-gpu", type=float, help="default: the profile's fabric")
    ap.add_argument("--gpus-per-node", type=int, default=8,
                    help="GPUs that share a node's NVLink domain (default: 8, a DGX)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--out-dir", type=Path, help="write LGS heat maps of the best and the "
                                                 "config's layout here")
    ap.add_argument("--json", type=Path, help="also write the plans and answers to this file")
    a = ap.parse_args(argv)
    for flag, value, ok in (("--gpus", a.gpus, a.gpus >= 1), ("--top", a.top, a.top >= 1),
                            ("--global-batch", a.global_batch,
                             a.global_batch is None or a.global_batch >= 1),
                            ("--seq-length", a.seq_length,
                             a.seq_length is None or a.seq_length >= 1),
                            ("--nic-gbit-per-gpu", a.nic_gbit_per_gpu,
                             a.nic_gbit_per_gpu is None
                             or 0 < a.nic_gbit_per_gpu < math.inf),
                            ("--gpus-per-node", a.gpus_per_node, a.gpus_per_node >= 1)):
        if not ok:
            _fail(f"{flag} must be a finite positive number, got {value}")
    if not fills_nodes(a.gpus, a.gpus_per_node):
        _fail(f"--gpus {a.gpus} does not fill nodes of --gpus-per-node {a.gpus_per_node}")
    if a.out_dir:  # before the search, which takes a while
        try:
            a.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _fail(f"--out-dir {a.out_dir}: {e.strerror}")
    if a.json and (why := unwritable_file(a.json)):
        _fail(f"--json {a.json}: {why}")
    refused: list[str] = []
    try:
        base, ref = resolve(a.model, a.hardware, a.gpus, a.global_batch, a.nic_gbit_per_gpu,
                            a.gpus_per_node, a.seq_length, on_refused=refused.append)
    except (ValueError, KeyError) as e:
        _fail(str(e))
    if next(layouts(base), None) is None:
        _fail(f"no layout of {a.model} divides {a.gpus} GPUs and global batch "
              f"{base.global_batch} (TP x PP x CP x DP = GPUs, DP x micro-batch | batch)")
    unfit: list[Run] = []
    cands = candidates(base, unfit)
    print(f"# {LABEL}")
    for caveat in caveats(a.hardware, base):
        print(f"# {caveat}")
    print(f"# {a.model} on {a.gpus} x {a.hardware} ({base.gpus_per_node} a node), global batch "
          f"{base.global_batch}: "
          f"{len(cands)} layouts fit in memory")
    for line in refused:
        print(f"# {line}")
    if not cands:
        _fail(f"no layout fits in memory; {_leanest(unfit)}")
    sys.stdout.flush()  # the header before the search, which takes minutes on thousands of GPUs
    known: dict[Run, StepEstimate] = {}
    top = best_of(cands, a.top, known=known)
    print(f"{'rank':>4} {'layout':<48} {'step s':>8} {'MFU':>6} {'mem GB':>6} "
          f"{'LGS MB':>11} {'LGS step':>8} {'spread':>7}")
    # The full 8..256 MB grid for the best (and the config's layout); a 3 x 3 subset of it for
    # the runners-up, whose thresholds are indicative.
    plans = [with_thresholds(e, GRID_MB if i == 0 else ROW_GRID_MB) for i, e in enumerate(top)]
    for i, p in enumerate(plans, 1):
        print(row(i, p))
    best = plans[0]
    print(f"best flags: {best_flags(a.model, base, best)}")
    if best.run.zero == 2:
        print("note: this trainer checkpoints Megatron-FSDP only at ZeRO-3, so the ZeRO-2 "
              "layout runs with --no-save; for a checkpointed run take a ZeRO-1 or ZeRO-3 row")
    rp = None
    if ref is not None:
        rp = with_thresholds(predict_run(ref))
        print(row("ref", rp) + f"  <- {a.model}'s own layout"
              + ("" if rp.estimate.fits_memory else " (does NOT fit in memory)"))
        print(f"best vs config layout: {rp.estimate.step_time_s / best.estimate.step_time_s:.3f}x")
    answers = questions(cands, best.estimate, base, unfit, known)
    lgs_best = best if lgs_applies(best.run) else next(
        (with_thresholds(e) for e in best_of(cands, 1, lgs_applies, known)), None)
    if lgs_best is None:
        answers.append("bucket thresholds: no layout LGS applies to (ZeRO 0/1) fits in memory")
    else:
        which = "the best layout" if lgs_best is best else \
            f"the best layout LGS applies to (ZeRO 0/1: {describe(lgs_best.run)})"
        answers.append(f"bucket thresholds on {which} move the step by "
                       f"{lgs_best.grid_spread:.2%} over the 8-256 MB grid (the 'spread' column)")
    for line in answers:
        print(f"answer: {line}")
    if a.json:
        _write(a.json, json.dumps({
            "model": a.model, "gpus": a.gpus, "hardware": a.hardware,
            "gpus_per_node": base.gpus_per_node, "global_batch": base.global_batch,
            "layouts_fit": len(cands), "caveats": caveats(a.hardware, base),
            "plans": [plan_record(a.model, base, p) for p in plans],
            "config_layout": plan_record(a.model, base, rp) if rp else None,
            "config_layout_refused": refused[0] if refused else None,
            "answers": answers}, indent=1) + "\n")
    if a.out_dir:
        write_heatmaps(a.out_dir, a.model, lgs_best, ref)
    return plans


def _leanest(unfit: list[Run]) -> str:
    """The layout that needs the least memory, and how much more than a GPU has: how far the
    model is from fitting on these GPUs."""
    lean = min(unfit, key=lambda r: memory(r).peak_bytes)
    m = memory(lean)
    return (f"the leanest, {describe(lean)}, needs {m.peak_bytes / 1e9:.1f} GB a GPU of the "
            f"{m.limit_bytes / 1e9:.1f} GB the model leaves usable")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        _fail(f"--json {path}: {e.strerror}")


def _fail(message: str) -> NoReturn:
    print(f"plan_run: {message}", file=sys.stderr)
    raise SystemExit(2)


def write_heatmaps(out: Path, name: str, best: Plan | None, ref: Run | None) -> None:
    from megatron_lgs.lgs.simreport import write_heatmap

    out.mkdir(parents=True, exist_ok=True)
    for tag, r in (("best", best.run if best else None), ("config", ref)):
        if r is None or not lgs_applies(r):
            continue
        preds = [e.sync for e in threshold_sweep(r)]
        path = out / f"plan_{name.replace('/', '_')}_{tag}_heatmap.png"
        write_heatmap(preds, GRID_MB, path, f"{name} {tag}: {describe(r)}")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
