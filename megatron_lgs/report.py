"""Plots and a one-page summary of a run, from the metrics.jsonl its checkpoints sit next to.

    python -m megatron_lgs.report RUN_DIR [--out DIR]

Writes one PNG per panel (loss, learning rate, grad norm, throughput, skipped steps, per-layer
grad norms; per-domain weights and losses, MoE expert load and LGS communication fraction when
the run recorded them) and summary.md, which says which panels had no data.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# panel file -> (title, y label, [(event, field prefix, legend)])
PANELS = {
    "loss.png": ("Loss", "lm loss", [("train", "loss", "train"), ("valid", "loss", "validation")]),
    "learning_rate.png": ("Learning rate", "lr", [("train", "lr", "lr")]),
    "grad_norm.png": ("Gradient norm (before clipping)", "norm",
                      [("train", "grad_norm", "global")]),
    "throughput.png": ("Throughput", "tokens/s", [("log", "tokens_per_second", "tokens/s")]),
    "skipped.png": ("Skipped and NaN iterations (cumulative)", "count",
                    [("log", "skipped_iterations", "skipped"),
                     ("log", "nan_iterations", "NaN")]),
    "layer_grad_norms.png": ("Gradient norm per layer", "norm", [("log", "grad_norm.*", "")]),
    "domain_weights.png": ("Data mix: domain weights", "weight",
                           [("data_mix", "weight.*", "")]),
    "domain_losses.png": ("Data mix: per-domain validation loss", "loss",
                          [("data_mix", "loss.*", "")]),
    "moe_expert_load.png": ("MoE expert load imbalance (max/mean)", "ratio",
                            [("moe", "imbalance.*", "")]),
    "lgs_comm_fraction.png": ("LGS: communication fraction of the step", "fraction",
                              [("lgs", "comm_fraction", "comm fraction")]),
}


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"report: error: {path} not found (is RUN_DIR the run's --save dir?)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"report: skipping malformed line {number} of {path}", file=sys.stderr)
    return records


def series(records: list[dict], event: str, field: str) -> dict[str, list[tuple[int, float]]]:
    """name -> [(iteration, value)], the last record winning for an iteration (rollbacks)."""
    found: dict[str, dict[int, float]] = defaultdict(dict)
    for record in records:
        if record.get("event") != event:
            continue
        for key, value in record.items():
            matches = key == field or (field.endswith("*") and key.startswith(field[:-1]))
            if matches and isinstance(value, int | float) and math.isfinite(value):
                found[key][record["iteration"]] = float(value)
    return {name: sorted(points.items()) for name, points in found.items()}


def render(run_dir: Path, out_dir: Path) -> list[str]:
    records = read_records(run_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"report: error: --out {out_dir}: {e.strerror}") from None
    lines = [f"# Run report: {run_dir}", ""]
    train = series(records, "train", "loss").get("loss", [])
    valid = series(records, "valid", "loss").get("loss", [])
    if train:
        lines.append(f"- iterations: {train[0][0]}..{train[-1][0]}; "
                     f"final train loss {train[-1][1]:.4f}")
    if valid:
        lines.append(f"- validation loss: {valid[0][1]:.4f} (iteration {valid[0][0]}) -> "
                     f"{valid[-1][1]:.4f} (iteration {valid[-1][0]})")
    skipped = [r for r in records if r.get("event") == "train" and r.get("skipped")]
    lines.append(f"- skipped updates: {len(skipped)}"
                 + "".join(f"; {r['iteration']}: {r.get('reason')}" for r in skipped[:10]))
    lines += ["", "| panel | data |", "|---|---|"]
    for filename, (title, ylabel, specs) in PANELS.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        plotted = 0
        for event, field, legend in specs:
            for name, points in series(records, event, field).items():
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=legend or name.split(".", 1)[-1])
                plotted += 1
        if plotted:
            ax.set_title(title)
            ax.set_xlabel("iteration")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize="small")
            fig.tight_layout()
            fig.savefig(out_dir / filename, dpi=100)
            lines.append(f"| ![{title}]({filename}) | {plotted} series |")
        else:
            lines.append(f"| {title} | not recorded in this run |")
        plt.close(fig)
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m megatron_lgs.report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="where to write (default: RUN_DIR/report)")
    args = parser.parse_args(argv)
    lines = render(args.run_dir, args.out or args.run_dir / "report")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
