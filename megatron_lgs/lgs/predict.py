"""`python -m megatron_lgs.lgs.simulate predict RUNS.json`: one JSON line per run, in order.

RUNS.json is a JSON list of runs (fields in `runspec`). Each good run prints
{"id", "predicted_step_time_s", "predicted_tflops_per_gpu", "predicted_mfu", "fits_memory",
"peak_memory_gb", "breakdown", "unknown_fields", "inert_fields", "assumed"} on stdout (the
breakdown in seconds per term, summing to the step time; TFLOP/s are Megatron-LM's model FLOPs,
6N plus attention, recompute not counted; MFU against the GPU's dense BF16 peak, FP16 on V100;
the fields it ignored: keys that are no run field, and fields set that change nothing for that
run, `runspec.inert_fields`; and the fields left null that were read from the run itself,
`run_defaults`). A bad run prints one line on stderr naming
the run and the field, and the others are still predicted; the exit code is then 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from megatron_lgs.lgs.runspec import RunError, inert_fields, read_run, unknown_fields
from megatron_lgs.lgs.stepmodel import StepEstimate, predict_run


def prediction_record(est: StepEstimate) -> dict[str, Any]:
    return {
        "id": est.run.id,
        "predicted_step_time_s": round(est.step_time_s, 6),
        "predicted_tflops_per_gpu": round(est.tflops_per_gpu, 3),
        "predicted_mfu": round(est.mfu, 4),
        "fits_memory": est.fits_memory,
        "peak_memory_gb": round(est.memory.peak_bytes / 1e9, 2),
        "breakdown": {k: round(v, 6) for k, v in est.breakdown.items()},
    }


def _run_name(i: int, raw: Any) -> str:
    if isinstance(raw, dict) and raw.get("id") is not None:
        return str(raw["id"])
    return f"#{i}"


def predict_file(path: Path, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print one line per run; the exit code: 0, or 2 if the file or any run was bad."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        runs = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"predict: cannot read {path}: {e}".replace("\n", " "), file=err)
        return 2
    if not isinstance(runs, list):
        print(f"predict: {path} must hold a JSON list of runs", file=err)
        return 2
    code = 0
    for i, raw in enumerate(runs):
        name = _run_name(i, raw)
        try:
            run, assumed = read_run(raw)
            est = predict_run(run)
        except RunError as e:
            print(f"predict: run {name}: {e}", file=err)
            code = 2
            continue
        except ValueError as e:  # an inconsistency only the model's own checks catch
            print(f"predict: run {name}: {e}".replace("\n", " "), file=err)
            code = 2
            continue
        record = {**prediction_record(est), "unknown_fields": unknown_fields(raw),
                  "inert_fields": inert_fields(raw, run), "assumed": assumed}
        print(json.dumps(record), file=out)
        out.flush()
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m megatron_lgs.lgs.simulate predict RUNS.json", file=sys.stderr)
        return 2
    return predict_file(Path(argv[0]))
