"""How much gradient communication each sync scheme leaves exposed, on an emulated 2-node cluster.

Two network-namespace "nodes" x 2 gloo ranks (`launch/emulate_cluster.py`), the inter-node link
limited to 0.5, 1 and 4 Gbit/s. One GPT, the distributed optimizer, and in the same processes,
measured in interleaved rounds (the scheme order rotates every round):

  (a) no overlap     megatron-core DDP, one reduction after the backward
  (b) megatron       + overlap_grad_reduce, default bucket
  (c) megatron best  + the best --ddp-bucket-size of a sweep (measured first, here)
  (d) 2-level        megatron's num_distributed_optimizer_instances = nodes, with overlap
  (e) LGS cost model thresholds the calibrated cost model predicts best on the grid
  (f) LGS autotuned  after the online tuner (real step times, decided on rank 0) settled
  (g) LGS int8       (e)'s thresholds, --lgs-compress int8

Step = zero grads -> forward/backward of every micro-batch (no_sync on all but the last) ->
finish_grad_sync. Compute = until the last backward returned; wait = time in finish_grad_sync;
exposed communication = step - (a)'s compute (what the step costs beyond computing; it also
counts communication that blocks or slows the backward, which a wait alone would miss).
CPU = CPU time of all of a rank's threads per step (the busiest rank's median): on these shared
cores what a scheme's communication costs the compute beside it.

    python bench/lgs_overlap.py                 # the full run (many minutes)
    python bench/lgs_overlap.py --quick         # 1 Gbit/s, 1 micro-batch, small GPT
    python bench/lgs_overlap.py --int8-loss-steps 200   # + INT8 loss gap, slowest link

Needs root and iproute2 (network namespaces). Figures are measurements of this machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from lgs_emulated import (
    REPO,
    Worker,
    add_model_args,
    model_flags,
    parse_bench_args,
    read_ranks,
    run_on_cluster,
    slowest_median,
)

SCHEMES = ("a no-overlap", "b megatron", "c megatron-best", "d 2-level", "e LGS model",
           "f LGS tuned", "g LGS int8")
# The cost model's pick and the tuner's range, per level. LGS closes buckets at layer
# boundaries, so intra thresholds under a layer's bytes are one plan (the tuner skips them).
INTRA_GRID_MB = [1, 2, 4, 8, 16, 32, 64]
INTER_GRID_MB = [1, 2, 4, 8, 16]


# -- worker (one rank) --------------------------------------------------------------------------
def _measure(w: Worker, ddp, steps: int) -> list[list[float]]:
    w.step(ddp)  # after a switch: megatron's / LGS's first-step bookkeeping, caches
    out = []
    for _ in range(steps):
        t, _ = w.step(ddp)
        out.append([t.step, t.compute, t.wait, t.cpu])
    return out


def _slowest_median_step(w: Worker, samples: list[list[float]]) -> float:
    return w.slowest(statistics.median(s[0] for s in samples))


def worker(a: argparse.Namespace) -> None:
    import torch

    from megatron_lgs.lgs import calibrate
    from megatron_lgs.lgs.recommend import recommend, workload_for_config

    nodes, per_node = a.nodes, a.gpus_per_node
    w = Worker(model_flags(a), a.micro_batches[0], a.comm_priority)
    cfg = w.cfg
    hw, meas = w.calibrate(per_node)
    overlap = replace(cfg.optim, overlap_grad_reduce=True)
    lgs_cfg = replace(cfg, lgs=replace(cfg.lgs, lgs=True, lgs_autotune=True,
                                       lgs_autotune_min_mb=min(INTRA_GRID_MB),
                                       lgs_autotune_max_mb=max(INTRA_GRID_MB),
                                       lgs_autotune_inter_min_mb=min(INTER_GRID_MB),
                                       lgs_autotune_inter_max_mb=max(INTER_GRID_MB)))
    rec = recommend(workload_for_config(lgs_cfg, per_node, hw), INTRA_GRID_MB, INTER_GRID_MB)
    lgs_cfg = replace(lgs_cfg, lgs=replace(lgs_cfg.lgs, lgs_intra_threshold_mb=rec.intra_mb,
                                           lgs_inter_threshold_mb=rec.inter_mb))
    models = {"a no-overlap": w.build(cfg), "b megatron": w.build(replace(cfg, optim=overlap))}

    # (c): megatron's bucket size swept on its own, the fastest kept.
    sweep = {0: _slowest_median_step(w, _measure(w, models["b megatron"], a.steps))}
    for size in a.bucket_sweep:
        ddp = w.build(replace(cfg, optim=replace(overlap, ddp_bucket_size=size)))
        sweep[size] = _slowest_median_step(w, _measure(w, ddp, a.steps))
        del ddp
    best_bucket = min(sweep, key=sweep.get)
    models["c megatron-best"] = models["b megatron"] if best_bucket == 0 else w.build(
        replace(cfg, optim=replace(overlap, ddp_bucket_size=best_bucket)))
    models["d 2-level"] = w.build_two_level(replace(cfg, optim=overlap), nodes)
    lgs = w.build(lgs_cfg)
    models["g LGS int8"] = w.build(replace(lgs_cfg, lgs=replace(lgs_cfg.lgs, lgs_compress="int8")))
    tuned = w.tune(lgs, lgs_cfg, a.tune_max_steps)
    thresholds = {"e LGS model": (rec.intra_mb, rec.inter_mb),
                  "f LGS tuned": tuple(tuned["thresholds"])}
    models["e LGS model"] = models["f LGS tuned"] = lgs

    record = {"times": {}, "losses": {}, "bucket_sweep": sweep, "best_bucket": best_bucket,
              "thresholds": thresholds, "tuner": tuned, "profile": calibrate.describe(hw, meas),
              "predicted_step_e": rec.prediction.step_time_s,
              "numel": sum(p.numel() for p in lgs.module.parameters()),
              "megatron_buckets": len(models["b megatron"].bucket_groups),
              "lgs_buckets": {k: None for k in thresholds}}
    for mb in a.micro_batches:
        w.micro_batches = mb
        w.batches = (w.batches * mb)[:mb]
        for name in SCHEMES:
            record["times"][f"{name}|{mb}"] = []
        for r in range(a.rounds):
            order = SCHEMES[r % len(SCHEMES):] + SCHEMES[:r % len(SCHEMES)]
            for name in order:
                ddp = models[name]
                if name in thresholds:
                    ddp.lgs.set_thresholds(*thresholds[name])
                    record["lgs_buckets"][name] = sum(len(b.plan.buckets)
                                                      for b in ddp.lgs.buffers)
                record["times"][f"{name}|{mb}"] += _measure(w, ddp, a.steps)
    if a.trace_dir:
        traced = w.build(replace(lgs_cfg, lgs=replace(
            lgs_cfg.lgs, lgs_autotune=False, lgs_trace_dir=a.trace_dir, lgs_trace_steps=3,
            lgs_intra_threshold_mb=thresholds["f LGS tuned"][0],
            lgs_inter_threshold_mb=thresholds["f LGS tuned"][1])))
        for _ in range(4):
            w.step(traced)
        traced.zero_grad_buffer()  # writes the trace of the last traced step
    torch.distributed.barrier()
    w.write(a.out, record)
    w.finish()


# -- driver -------------------------------------------------------------------------------------
def _table(ranks: list[dict], mb: int) -> dict[str, tuple[float, float, float, float]]:
    rows = {}
    for name in SCHEMES:
        key = f"{name}|{mb}"
        rows[name] = tuple(slowest_median(ranks, key, f) for f in range(4))
    return rows


def report(gbit: float, measured: float, ranks: list[dict], a: argparse.Namespace) -> dict:
    r0 = ranks[0]
    print(f"# {gbit:g} Gbit/s ({measured / 1e9:.3f} measured): {a.nodes} nodes x "
          f"{a.gpus_per_node} ranks, GPT {r0['numel'] / 1e6:.1f} M parameters "
          f"({4 * r0['numel'] / 2**20:.0f} MB fp32 gradients), distributed optimizer")
    print(f"# calibration (rank 0): {r0['profile']}")
    def size(k) -> str:
        return "default" if int(k) == 0 else f"{int(k) / 1e6:g}M"

    sweep = ", ".join(f"{size(k)} {1e3 * v:.0f} ms" for k, v in r0["bucket_sweep"].items())
    print(f"# megatron --ddp-bucket-size sweep (parameters -> step): {sweep}; best "
          f"{size(r0['best_bucket'])} (the default is {r0['megatron_buckets']} bucket(s))")
    th = r0["thresholds"]
    t = r0["tuner"]
    print(f"# LGS thresholds (intra/inter MB): cost model {th['e LGS model']} (predicted step "
          f"{1e3 * r0['predicted_step_e']:.0f} ms at 1 micro-batch), tuned {th['f LGS tuned']} "
          f"after {t['trials']} trials / {t['steps']} steps"
          f"{'' if t['done'] else ' (stopped before the tuner finished)'}; buckets "
          f"{r0['lgs_buckets']}")
    results = {}
    for mb in a.micro_batches:
        rows = _table(ranks, mb)
        compute = rows["a no-overlap"][1]
        exposed = {n: max(0.0, rows[n][0] - compute) for n in SCHEMES}
        print(f"\n## {gbit:g} Gbit/s, {mb} micro-batch(es): medians of the slowest rank, "
              f"{a.rounds} rounds x {a.steps} steps")
        print(f"{'scheme':<16} {'step ms':>8} {'wait ms':>8} {'exposed ms':>10} "
              f"{'step/(a)':>8} {'step/(b)':>8} {'step/(c)':>8} {'exp/(a)':>8} {'exp/(b)':>8} "
              f"{'exp/(c)':>8} {'cpu ms':>7}")
        sa, sb, sc = (rows[k][0] for k in SCHEMES[:3])
        ea, eb, ec = (exposed[k] for k in SCHEMES[:3])

        def ratio(x: float, y: float) -> str:
            return f"{x / y:8.3f}" if y > 0 else f"{'-':>8}"

        for n in SCHEMES:
            step, _, wait, cpu = rows[n]
            print(f"{n:<16} {1e3 * step:8.0f} {1e3 * wait:8.0f} {1e3 * exposed[n]:10.0f} "
                  f"{ratio(step, sa)} {ratio(step, sb)} {ratio(step, sc)} "
                  f"{ratio(exposed[n], ea)} {ratio(exposed[n], eb)} {ratio(exposed[n], ec)} "
                  f"{1e3 * cpu:7.0f}")
        print(f"compute (a) {1e3 * compute:.0f} ms; gradient sync without overlap (a's wait) "
              f"{1e3 * rows['a no-overlap'][2]:.0f} ms = "
              f"{rows['a no-overlap'][2] / compute:.2f}x the compute")
        results[mb] = {"rows": rows, "exposed": exposed}
    return results


def targets(res: dict) -> None:
    rows, exposed = res["rows"], res["exposed"]
    lgs = min(("e LGS model", "f LGS tuned"), key=lambda n: rows[n][0])
    step = rows[lgs][0]
    best_mega = min(rows["c megatron-best"][0], rows["d 2-level"][0])
    e_ratio = exposed[lgs] / exposed["a no-overlap"] if exposed["a no-overlap"] else float("nan")
    print(f"\ntargets at 1 Gbit/s, 1 micro-batch ({lgs}):")
    print(f"  LGS exposed / (a) exposed: {e_ratio:.3f} (target <= 0.5) "
          f"{'met' if e_ratio <= 0.5 else 'MISSED'}")
    print(f"  LGS step / (b) step: {step / rows['b megatron'][0]:.3f} (target <= 1.0) "
          f"{'met' if step <= rows['b megatron'][0] else 'MISSED'}")
    print(f"  LGS step / min((c), (d)) step: {step / best_mega:.3f} (target <= 1.03) "
          f"{'met' if step <= 1.03 * best_mega else 'MISSED'}")


def int8_loss_gap(a: argparse.Namespace, gbit: float, tmp: Path) -> None:
    """LGS vs LGS+INT8 with the real trainer on the slowest link: step time and loss gap."""
    from launch.emulate_cluster import emulated_cluster

    world = a.nodes * a.gpus_per_node
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "$NNODES",
            "--node-rank", "$NODE_RANK", "--nproc-per-node", str(a.gpus_per_node),
            "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT",
            str(REPO / "pretrain_gpt.py"), "--train-iters", str(a.int8_loss_steps),
            "--log-interval", "1", "--eval-interval", str(10 * a.int8_loss_steps),
            "--eval-iters", "0", "--save-interval", str(10 * a.int8_loss_steps),
            "--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
            "--num-attention-heads", str(a.heads), "--seq-length", str(a.seq_length),
            "--micro-batch-size", str(a.micro_batch_size),
            "--global-batch-size", str(a.micro_batch_size * world),
            "--data-cache-dir", str(tmp / "data"),
            "--use-distributed-optimizer", "--lgs", "--lgs-intra-threshold-mb", "4",
            "--lgs-inter-threshold-mb", "2",
            *([] if a.ring_reduce_scatter else ["--reduce-scatter-with-fp32-accumulation"])]
    runs = {}
    with emulated_cluster(nodes=a.nodes, gpus_per_node=a.gpus_per_node, inter_gbit=gbit) as c:
        for name, extra in (("LGS", []), ("LGS int8", ["--lgs-compress", "int8"])):
            save = tmp / name.replace(" ", "_")
            save.with_suffix(".logs").mkdir(parents=True, exist_ok=True)
            cmd = " ".join(base + ["--save", str(save)] + extra)
            exits = c.run_on_nodes(["sh", "-c", cmd], env={"OMP_NUM_THREADS": "1",
                                                           "PYTHONPATH": str(REPO)},
                                   log_dir=save.with_suffix(".logs"), timeout=3600)
            if exits.status:
                raise RuntimeError(f"{name} run failed; logs in {save.with_suffix('.logs')}")
            recs = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
            # The step time is what the lgs event's fractions are of.
            runs[name] = ([r["loss"] for r in recs if r["event"] == "train"],
                          [r["comm_seconds"] / r["comm_fraction"] for r in recs
                           if r["event"] == "lgs" and r["comm_fraction"] > 0])
    (la, ta), (lb, tb) = runs["LGS"], runs["LGS int8"]
    tail = max(1, len(la) // 10)
    gap = abs(statistics.fmean(lb[-tail:]) - statistics.fmean(la[-tail:])) / statistics.fmean(
        la[-tail:])
    steps = [statistics.median(t[len(t) // 4:]) for t in (ta, tb)]
    print(f"\n# INT8 at {gbit:g} Gbit/s, {len(la)} steps of the trainer: step {1e3 * steps[0]:.0f}"
          f" ms -> {1e3 * steps[1]:.0f} ms ({steps[1] / steps[0]:.3f}x); final loss (mean of the"
          f" last {tail}) {statistics.fmean(la[-tail:]):.4f} vs {statistics.fmean(lb[-tail:]):.4f}"
          f" (gap {100 * gap:.2f}%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, hidden=512, layers=4, seq=64, vocab=8192)
    p.add_argument("--quick", action="store_true",
                   help="1 Gbit/s, 1 micro-batch, a small GPT, 2 rounds x 2 steps")
    p.add_argument("--gbit", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="steps per scheme per round")
    p.add_argument("--bucket-sweep", type=int, nargs="+",
                   default=[250_000, 1_000_000, 4_000_000, 16_000_000],
                   help="--ddp-bucket-size values (parameters) swept for (c)")
    p.add_argument("--tune-max-steps", type=int, default=120)
    p.add_argument("--trace-dir", type=Path, help="Chrome traces of LGS at 1 Gbit/s")
    p.add_argument("--int8-loss-steps", type=int, default=0,
                   help="also train LGS and LGS+INT8 this many steps on the slowest link")
    p.add_argument("--int8-only", action="store_true",
                   help="only the INT8 loss-gap runs (with --int8-loss-steps)")
    if "--quick" in sys.argv:  # defaults only: flags given explicitly still win
        p.set_defaults(gbit=[1.0], micro_batches=[1], rounds=2, steps=2, hidden_size=256,
                       num_layers=2, tune_max_steps=60, bucket_sweep=[250_000, 1_000_000])
    a = parse_bench_args(p)
    if a.worker:
        worker(a)
        return
    with tempfile.TemporaryDirectory(prefix="lgs_overlap_") as tmp:
        tmp = a.work_dir or tmp
        for gbit in [] if a.int8_only else a.gbit:
            out = Path(tmp, f"gbit{gbit:g}")
            trace = a.trace_dir and gbit == 1.0
            args = [arg for arg in sys.argv[1:] if arg != "--worker"]
            args = _without(args, "--trace-dir", "--gbit", "--work-dir")
            if trace:
                args += ["--trace-dir", str(out / "trace")]
            measured = run_on_cluster(Path(__file__), args, gbit=gbit, nodes=a.nodes,
                                      per_node=a.gpus_per_node, out=out, timeout=a.timeout)
            res = report(gbit, measured, read_ranks(out), a)
            if gbit == 1.0 and 1 in res:
                targets(res[1])
            if trace:
                a.trace_dir.mkdir(parents=True, exist_ok=True)
                for f in (out / "trace").glob("*.json"):
                    shutil.copy(f, a.trace_dir / f.name)
                print(f"# traces of LGS at (f)'s thresholds: {a.trace_dir}")
        if a.int8_loss_steps:
            int8_loss_gap(a, min(a.gbit), Path(tmp))


def _without(args: list[str], *flags: str) -> list[str]:
    """argv minus the given options and their values."""
    out, skip = [], False
    for arg in args:
        if skip and not arg.startswith("--"):
            continue
        skip = arg in flags
        if not skip:
            out.append(arg)
    return out


if __name__ == "__main__":
    main()
