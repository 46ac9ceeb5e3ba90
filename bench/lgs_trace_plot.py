"""Draw one step of LGS's Chrome traces (`--lgs-trace-dir`) as a PNG: for every rank, when each
bucket was ready on the training thread, what the intra- and inter-node threads ran, and how
long the training thread waited for them; and print the same as text.

    python bench/lgs_trace_plot.py TRACE_DIR --out timeline.png [--step N]

Ranks of one host (the emulated cluster) share one time axis, from the traces' origins on
the host's monotonic clock; ranks of different hosts each start at their own first event of
the step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_lgs.lgs.trace import THREADS  # noqa: E402
from megatron_lgs.value_checks import output_file  # noqa: E402

LANES = {tid: name for name, tid in THREADS.items()}  # the trace's thread ids -> lanes
BACKWARD = THREADS["backward"]
COLORS = {"intra": "tab:blue", "inter": "tab:orange", "wait": "tab:red"}


def load_step(path: Path, step: int | None) -> tuple[int, list[dict], dict]:
    """(step, events of that step, the trace's `otherData`) of one rank's trace; the last
    traced step by default."""
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    if not events:
        raise SystemExit(f"lgs_trace_plot: {path}: no events")
    steps = sorted({e["args"]["step"] for e in events})
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise SystemExit(f"lgs_trace_plot: {path}: step {chosen} not traced (have {steps})")
    return chosen, [e for e in events if e["args"]["step"] == chosen], trace.get("otherData", {})


def on_one_clock(traces: dict[int, list[dict]], others: dict[int, dict]) -> bool:
    """Shift every rank's events onto the host's monotonic clock when all ranks ran on one
    host and say where their trace's clock started; returns whether it did."""
    hosts = {o.get("host") for o in others.values()}
    if len(hosts) != 1 or None in hosts or any(
            "monotonic_origin_s" not in o for o in others.values()):
        return False
    for rank, events in traces.items():
        shift = others[rank]["monotonic_origin_s"] * 1e6
        traces[rank] = [{**e, "ts": e["ts"] + shift} for e in events]
    return True


def summary(events: list[dict], t0: float) -> dict:
    """Milliseconds from `t0` (us): last bucket ready, the wait's start and length, and the
    time each communication thread was busy."""
    ready = [e["ts"] for e in events if e["ph"] == "i"]
    wait = [e for e in events if e["ph"] == "X" and e["tid"] == BACKWARD]
    busy = {lane: sum(e["dur"] for e in events if e["ph"] == "X" and e["tid"] == tid)
            for tid, lane in LANES.items() if tid != BACKWARD}
    out = {"last_ready_ms": (max(ready) - t0) / 1e3 if ready else None,
           "intra_busy_ms": busy["intra-node"] / 1e3, "inter_busy_ms": busy["inter-node"] / 1e3}
    if wait:
        out["wait_start_ms"] = (wait[-1]["ts"] - t0) / 1e3
        out["wait_ms"] = wait[-1]["dur"] / 1e3
    return out


def _color(name: str) -> str:
    return COLORS["wait"] if name.startswith("wait") else COLORS[
        "inter" if name.startswith("inter") else "intra"]


def plot(traces: dict[int, list[dict]], origins: dict[int, float], out: Path, xlabel: str,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 1.1 + 0.9 * len(traces)))
    ticks, labels = [], []
    for i, (rank, events) in enumerate(sorted(traces.items())):
        t0 = origins[rank]
        for tid, lane in LANES.items():
            y = i * (len(LANES) + 1) + (len(LANES) - tid)  # backward on top
            ticks.append(y)
            labels.append(f"rank {rank} {lane}")
            for e in events:
                if e["tid"] != tid:
                    continue
                x = (e["ts"] - t0) / 1e3
                if e["ph"] == "X":
                    ax.broken_barh([(x, e["dur"] / 1e3)], (y - 0.4, 0.8),
                                   color=_color(e["name"]), edgecolor="black", linewidth=0.3)
                else:
                    ax.vlines(x, y - 0.45, y + 0.45, color="black", linewidth=0.8)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel(f"{xlabel} (black ticks: bucket ready)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, ["intra-node hop", "inter-node hop", "training thread waits"],
              loc="upper left", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> dict[int, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--out", type=output_file, help="PNG to write (text only without it)")
    ap.add_argument("--step", type=int, help="traced step to draw (default: the last)")
    a = ap.parse_args(argv)
    files = sorted(a.trace_dir.glob("lgs_trace_rank*.json"))
    if not files:
        raise SystemExit(f"lgs_trace_plot: no lgs_trace_rank*.json in {a.trace_dir}")
    traces, others, step = {}, {}, None
    for f in files:
        rank = int(f.stem.removeprefix("lgs_trace_rank"))
        step, traces[rank], others[rank] = load_step(f, a.step)
    if on_one_clock(traces, others):
        first = min(e["ts"] for events in traces.values() for e in events)
        origins = dict.fromkeys(traces, first)
        xlabel = "ms from the step's first event on any rank (one host, one clock)"
    else:
        origins = {r: min(e["ts"] for e in events) for r, events in traces.items()}
        xlabel = "ms from each rank's first event of the step"
    summaries = {}
    for rank in sorted(traces):
        summaries[rank] = s = summary(traces[rank], origins[rank])
        print(f"rank {rank} step {step}: last bucket ready at {s['last_ready_ms']:.0f} ms, "
              f"waits {s.get('wait_ms', 0):.0f} ms from {s.get('wait_start_ms', 0):.0f} ms; "
              f"intra thread busy {s['intra_busy_ms']:.0f} ms, inter {s['inter_busy_ms']:.0f} ms")
    print(xlabel)
    if a.out:
        plot(traces, origins, a.out, xlabel,
             f"LGS gradient sync, step {step} ({a.trace_dir.name})")
        print(f"wrote {a.out}")
    return summaries


if __name__ == "__main__":
    main()
