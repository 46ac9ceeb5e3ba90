"""Render simulator predictions: text table, heat map PNG, Chrome trace JSON."""

from __future__ import annotations

import json
from pathlib import Path

from megatron_lgs.lgs.timeline import MB, StepPrediction

LABEL = "PREDICTION (alpha-beta cost model, not a measurement)"


def grid_table(preds: list[StepPrediction]) -> str:
    """One row per (intra, inter) threshold pair."""
    head = (f"{'intra MB':>8} {'inter MB':>8} {'step s':>9} {'exposed ms':>10} {'comm %':>7} "
            f"{'idle %':>7} {'peak MB':>8} {'colls':>6}")
    rows = [head]
    for p in preds:
        rows.append(
            f"{p.thresholds.intra_bytes // MB:>8} {p.thresholds.inter_bytes // MB:>8} "
            f"{p.step_time_s:>9.4f} {p.exposed_comm_s * 1e3:>10.1f} {p.comm_fraction * 100:>7.2f} "
            f"{p.gpu_idle_fraction * 100:>7.2f} {p.peak_inflight_bytes / MB:>8.0f} "
            f"{p.num_collectives:>6}")
    return "\n".join(rows)


def write_heatmap(preds: list[StepPrediction], grid_mb: list[int], path: Path, title: str) -> None:
    """Exposed communication (ms) over the intra x inter grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(p.thresholds.intra_bytes // MB, p.thresholds.inter_bytes // MB): p for p in preds}
    data = [[by[(i, e)].exposed_comm_s * 1e3 for e in grid_mb] for i in grid_mb]
    fig, ax = plt.subplots(figsize=(7, 6))
    im = ax.imshow(data, origin="lower", cmap="viridis_r")
    ax.set_xticks(range(len(grid_mb)), [str(x) for x in grid_mb])
    ax.set_yticks(range(len(grid_mb)), [str(x) for x in grid_mb])
    ax.set_xlabel("inter-node threshold (MB)")
    ax.set_ylabel("intra-node threshold (MB)")
    for r, row in enumerate(data):
        for c, v in enumerate(row):
            ax.text(c, r, f"{v:.0f}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, label="exposed communication, ms")
    ax.set_title(f"{title}\n{LABEL}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def chrome_trace(pred: StepPrediction) -> dict:
    """chrome://tracing events of the last micro-batch's backward and the bucket collectives."""
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": s.stage,
                       "args": {"name": f"pipeline stage {s.stage}"}} for s in pred.stages]
    for s in pred.stages:
        for span in s.ops:
            ev.append({"name": span.name, "cat": "backward", "ph": "X", "pid": s.stage, "tid": 0,
                       "ts": span.start_s * 1e6, "dur": (span.end_s - span.start_s) * 1e6})
        for i, b in enumerate(s.buckets):
            ev.append({"name": f"bucket{i} {b.nbytes / MB:.0f}MB", "cat": "grad-sync", "ph": "X",
                       "pid": s.stage, "tid": 1, "ts": b.start_s * 1e6,
                       "dur": (b.end_s - b.start_s) * 1e6,
                       "args": {"group": b.group, "tensors": list(b.tensors),
                                "ready_us": b.ready_s * 1e6, "inter_messages": b.inter_messages}})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"label": LABEL}}


def write_trace(pred: StepPrediction, path: Path) -> None:
    path.write_text(json.dumps(chrome_trace(pred)))
