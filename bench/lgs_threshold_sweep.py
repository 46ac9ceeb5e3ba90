"""The calibrated cost model against measurement: an intra x inter threshold grid on the
emulated 2-node cluster, and the online auto-tuner on real step times.

On every rank of 2 network-namespace nodes x 2 (`launch/emulate_cluster.py`): the calibration
probe (`megatron_lgs.lgs.calibrate`) measures this cluster's links and backward time; one LGS
model (distributed optimizer) then runs every grid cell in interleaved rounds (a fresh cell
order each round), and the cost model (`lgs.timeline.predict_step` on the measured profile)
predicts every cell. Then the tuner (`lgs.online.OnlineTuning`, as `--lgs-autotune` runs it)
starts from the cost model's pick and from the worst grid corner; its incumbent after each
decision is scored by the grid's measured step time.

Prints both grids, the median |predicted - measured| / measured (target <= 15%), the
predicted-best cell's measured step against the measured best (target within 5%), and the
tuner's trials to within 5% of the measured optimum (target <= 12 from the cost model's pick);
writes a PNG with both heat maps.

    python bench/lgs_threshold_sweep.py [--gbit 1] [--intra-grid 8 16 32 64]
        [--inter-grid 1 2 4 8] [--png FILE]
    python bench/lgs_threshold_sweep.py --quick

The default grid is one where every cell is a different bucket plan for the default GPT
(12 MB layers; LGS closes buckets at layer boundaries, so intra thresholds of 1-8 MB all make
one bucket per layer, and an inter cap above a bucket's per-rank shard changes nothing).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from lgs_emulated import (
    Worker,
    add_model_args,
    model_flags,
    parse_bench_args,
    read_ranks,
    run_on_cluster,
)

from megatron_lgs.value_checks import unwritable_file  # lgs_emulated puts the repo on sys.path


# -- worker (one rank) --------------------------------------------------------------------------
def _cell_steps(w: Worker, ddp, cell: tuple[int, int], steps: int) -> list[float]:
    ddp.lgs.set_thresholds(*cell)
    w.step(ddp)  # the first step after a regrouping is not measured
    return [w.slowest(w.step(ddp)[0].step) for _ in range(steps)]


def worker(a: argparse.Namespace) -> None:
    from megatron_lgs.lgs import calibrate
    from megatron_lgs.lgs.recommend import recommend, workload_for_config
    from megatron_lgs.lgs.timeline import MB, Thresholds, predict_step

    intra, inter = a.intra_grid, a.inter_grid
    w = Worker(model_flags(a), a.micro_batches, a.comm_priority)
    cfg = w.cfg
    hw, meas = w.calibrate(a.gpus_per_node)
    lgs_cfg = replace(cfg, lgs=replace(cfg.lgs, lgs=True, lgs_autotune=True,
                                       lgs_autotune_min_mb=min(intra),
                                       lgs_autotune_max_mb=max(intra),
                                       lgs_autotune_inter_min_mb=min(inter),
                                       lgs_autotune_inter_max_mb=max(inter)))
    work = workload_for_config(lgs_cfg, a.gpus_per_node, hw)
    rec = recommend(work, intra, inter)
    cells = [(i, e) for i in intra for e in inter]
    predicted = {f"{i},{e}": predict_step(work, Thresholds(i * MB, e * MB)).step_time_s
                 for i, e in cells}
    ddp = w.build(lgs_cfg)
    measured: dict[str, list[float]] = {f"{i},{e}": [] for i, e in cells}
    for r in range(a.rounds):
        order = list(cells)
        random.Random(r).shuffle(order)  # the same order on every rank
        for cell in order:
            measured[f"{cell[0]},{cell[1]}"] += _cell_steps(w, ddp, cell, a.steps)
    medians = {k: statistics.median(v) for k, v in measured.items()}
    corners = [(i, e) for i in (min(intra), max(intra)) for e in (min(inter), max(inter))]
    worst = max(corners, key=lambda c: medians[f"{c[0]},{c[1]}"])
    tuner_runs = {}
    for name, start in (("cost model's pick", (rec.intra_mb, rec.inter_mb)),
                        ("worst corner", worst)):
        ddp.lgs.set_thresholds(*start)
        tuner_runs[name] = w.tune(ddp, lgs_cfg, a.tune_max_steps)
    w.write(a.out, {"grid": [intra, inter], "predicted": predicted, "measured": measured,
                    "recommended": [rec.intra_mb, rec.inter_mb], "tuner": tuner_runs,
                    "profile": calibrate.describe(hw, meas),
                    "numel": sum(p.numel() for p in ddp.module.parameters())})
    w.finish()


# -- driver -------------------------------------------------------------------------------------
def _grid_table(title: str, grid: list[list[int]], values: dict[str, float]) -> str:
    intra, inter = grid
    lines = [title, "intra\\inter " + " ".join(f"{e:>7}" for e in inter)]
    for i in intra:
        lines.append(f"{i:>11} " + " ".join(f"{1e3 * values[f'{i},{e}']:7.0f}" for e in inter))
    return "\n".join(lines)


def write_png(grid: list[list[int]], measured: dict, predicted: dict, path: Path,
              title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    intra, inter = grid
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    data = [np.array([[1e3 * d[f"{i},{e}"] for e in inter] for i in intra])
            for d in (measured, predicted)]
    lo, hi = min(x.min() for x in data), max(x.max() for x in data)
    for ax, values, name in zip(axes, data, ("measured", "predicted (calibrated model)"),
                                strict=True):
        im = ax.imshow(values, origin="lower", cmap="viridis", vmin=lo, vmax=hi)
        ax.set_xticks(range(len(inter)), [str(g) for g in inter])
        ax.set_yticks(range(len(intra)), [str(g) for g in intra])
        ax.set_xlabel("inter threshold (MB)")
        ax.set_ylabel("intra threshold (MB)")
        ax.set_title(f"{name}: step ms")
        best = np.unravel_index(values.argmin(), values.shape)
        for y in range(len(intra)):
            for x in range(len(inter)):
                ax.text(x, y, f"{values[y, x]:.0f}", ha="center", va="center", fontsize=7,
                        color="red" if (y, x) == best else "white")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(ranks: list[dict], gbit: float, measured_bw: float, a: argparse.Namespace) -> None:
    r0 = ranks[0]  # every rank holds the same slowest-rank samples
    grid = r0["grid"]
    meas = {k: statistics.median(v) for k, v in r0["measured"].items()}
    pred = r0["predicted"]
    print(f"# {gbit:g} Gbit/s ({measured_bw / 1e9:.3f} measured), {a.nodes} nodes x "
          f"{a.gpus_per_node}, GPT {r0['numel'] / 1e6:.1f} M parameters, "
          f"{a.micro_batches} micro-batch(es), {a.rounds} rounds x {a.steps} steps per cell")
    print(f"# {r0['profile']}")
    print(_grid_table("measured step ms (median of the slowest rank)", grid, meas))
    print(_grid_table("predicted step ms (cost model, measured profile)", grid, pred))
    errors = [abs(pred[k] - meas[k]) / meas[k] for k in meas]
    best_meas = min(meas, key=meas.get)
    best_pred = min(pred, key=pred.get)
    err = statistics.median(errors)
    gap = meas[best_pred] / meas[best_meas] - 1
    print(f"median |predicted - measured| / measured: {100 * err:.1f}% (target <= 15%) "
          f"{'met' if err <= 0.15 else 'MISSED'}; max {100 * max(errors):.1f}%")
    print(f"predicted best {best_pred} MB measures {1e3 * meas[best_pred]:.0f} ms, measured best "
          f"{best_meas} MB {1e3 * meas[best_meas]:.0f} ms: +{100 * gap:.1f}% (target <= 5%) "
          f"{'met' if gap <= 0.05 else 'MISSED'}; grid spread "
          f"{100 * (max(meas.values()) / min(meas.values()) - 1):.1f}%")
    print(f"cost model's pick on the grid (recommend): {r0['recommended']}")
    optimum = meas[best_meas]
    for name, run in r0["tuner"].items():
        within = next((trials for trials, th in run["path"]
                       if meas.get(f"{int(th[0])},{int(th[1])}", float("inf"))
                       <= 1.05 * optimum), None)
        end = run["thresholds"]
        end_ms = meas.get(f"{int(end[0])},{int(end[1])}")
        print(f"tuner from {name} {run['start']}: ends at {end} "
              f"({'-' if end_ms is None else f'{1e3 * end_ms:.0f} ms'}, "
              f"{'' if end_ms is None else f'+{100 * (end_ms / optimum - 1):.1f}% of the optimum'})"
              f" after {run['trials']} trials / {run['steps']} steps"
              f"{'' if run['done'] else ' (stopped: --tune-max-steps)'}; within 5% of the "
              f"measured optimum after {within if within is not None else 'never'} trials"
              + (" (target <= 12)" if name == "cost model's pick" else ""))
    png = a.png
    write_png(grid, meas, pred, png, f"LGS thresholds, 2 emulated nodes x {a.gpus_per_node}, "
              f"{gbit:g} Gbit/s: median |pred-meas|/meas {100 * err:.1f}%")
    print(f"wrote {png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, hidden=512, layers=4, seq=64, vocab=8192)
    p.add_argument("--quick", action="store_true", help="4x4 grid, small GPT, 1 round")
    p.add_argument("--gbit", type=float, default=1.0)
    p.add_argument("--intra-grid", type=int, nargs="+", default=[8, 16, 32, 64],
                   help="intra thresholds (MB, doublings)")
    p.add_argument("--inter-grid", type=int, nargs="+", default=[1, 2, 4, 8],
                   help="inter-node message caps (MB, doublings)")
    p.add_argument("--grid", type=int, nargs="+",
                   help="one list of values for both levels (overrides the two above)")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="measured steps per cell per round")
    p.add_argument("--tune-max-steps", type=int, default=150)
    p.add_argument("--png", type=Path, default=Path("lgs_threshold_sweep.png"))
    if "--quick" in sys.argv:  # defaults only: flags given explicitly still win
        p.set_defaults(intra_grid=[1, 2, 4, 8], rounds=1, steps=2, hidden_size=256,
                       num_layers=2, tune_max_steps=80)
    a = parse_bench_args(p)
    if not a.worker and (why := unwritable_file(a.png)):  # before minutes on the cluster
        p.error(f"--png {a.png}: {why}")
    if a.grid:
        a.intra_grid = a.inter_grid = a.grid
    if a.worker:
        worker(a)
        return
    with tempfile.TemporaryDirectory(prefix="lgs_sweep_") as tmp:
        out = Path(a.work_dir or tmp, "sweep")
        measured = run_on_cluster(Path(__file__), sys.argv[1:], gbit=a.gbit, nodes=a.nodes,
                                  per_node=a.gpus_per_node, out=out, timeout=a.timeout)
        report(read_ranks(out), a.gbit, measured, a)


if __name__ == "__main__":
    main()
