"""Step times of MLPerf Training results, from their published logs.

    python bench/mlperf_steps.py training_results_v4.0 [training_results_v4.1 ...]

For each system of each clone of an mlcommons/training_results_vX.Y repository, reads every
`<submitter>/results/<system>/<benchmark>/result_*.txt` (default benchmark gpt3) and prints the
median step time over all timed blocks of all its runs: a block's duration (its MLLOG
`block_start` to `block_stop`, evaluation outside) over the steps it holds. GPT-3's logs
(rounds 3.1-4.1) give a block's `epoch_count` in tokens, over the `global_batch_size` x
`max_sequence_length` the log reports; Llama 3.1's (rounds 5.0-5.1) count samples instead, each
evaluation's `samples_count` being the samples trained before it (the block events' own count
means different things in different submitters' logs), so a block holds the samples between the
evaluation before it (or the run's start) and the one after it, over the global batch.
`bench/mlperf_rows.py` holds the figures this prints. Logs whose one block spans
the whole run (GPT-3 of round 3.0) have no step time to give and are skipped.

Where the logs also carry the trainer's own time of each step (NeMo's `tracked_stats`, the
wall time between consecutive step ends: `train_step_time` in rounds 5.0-5.1,
`train_step_timing` or `train_step_timing in s` in some earlier submissions), the median of
those is printed beside it: a steady step, without what a block holds besides its steps (the
return from evaluation, the slow steps a median leaves out). The table's rows take that median
where a system logs it (`bench/mlperf_rows.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MLLOG = ":::MLLOG"
STEP_TIME_KEYS = ("train_step_time", "train_step_timing", "train_step_timing in s")


def mllog_events(log: str) -> list[dict]:
    """The MLLOG events of one result file, in order; other lines are the trainer's output."""
    return [json.loads(line.split(MLLOG, 1)[1]) for line in log.splitlines() if MLLOG in line]


def block_step_times(events: list[dict]) -> tuple[list[float], int | None]:
    """(step time of each timed block, global batch size) of one result file's events."""
    batch = seq = None
    starts: dict[int, tuple[int, int]] = {}
    block_ms: int | None = None  # samples-count logs: the open block's start
    ended: float | None = None  # its duration, s, until the evaluation after it counts it
    evaluated = 0  # samples trained before the last evaluation
    steps: list[float] = []
    for event in events:
        key, meta = event["key"], event.get("metadata", {})
        if key == "global_batch_size":
            batch = event["value"]
        elif key == "max_sequence_length":
            seq = event["value"]
        elif key == "block_start" and "epoch_count" in meta:
            starts[meta["first_epoch_num"]] = (event["time_ms"], meta["epoch_count"])
        elif key == "block_start" and "samples_count" in meta:
            block_ms = event["time_ms"]
        elif key == "block_stop" and meta.get("first_epoch_num") in starts and batch and seq:
            start_ms, tokens = starts[meta["first_epoch_num"]]
            steps_in_block = tokens / (batch * seq)
            if steps_in_block > 1:
                steps.append((event["time_ms"] - start_ms) / 1e3 / steps_in_block)
        elif key == "block_stop" and block_ms is not None:
            ended, block_ms = (event["time_ms"] - block_ms) / 1e3, None
        elif key == "eval_start" and "samples_count" in meta:
            trained = meta["samples_count"] - evaluated
            if ended is not None and batch and trained / batch > 1:
                steps.append(ended / (trained / batch))
            ended, evaluated = None, meta["samples_count"]
    return steps, batch


def logged_step_times(events: list[dict]) -> list[float]:
    """The trainer's own time of each step in one result file's events (`STEP_TIME_KEYS`)."""
    return [float(event["value"][k]) for event in events
            if event["key"] == "tracked_stats" and isinstance(event.get("value"), dict)
            for k in STEP_TIME_KEYS if k in event["value"]]


@dataclass(frozen=True)
class SystemSteps:
    """One system's step time from its timed blocks, and from its trainer's per-step times."""

    step_s: float  # median over all blocks of all runs
    batch: int | None
    blocks: int
    logged_step_s: float | None  # median of the trainer's step times; None: not logged
    logged_steps: int


def system_step_times(root: Path, benchmark: str = "gpt3") -> dict[str, SystemSteps]:
    """{submitter/system: its step times} for one results clone."""
    out = {}
    for system in sorted(root.glob(f"*/results/*/{benchmark}")):
        steps, logged, batch = [], [], None
        for result in sorted(system.glob("result_*.txt")):
            events = mllog_events(result.read_text(errors="replace"))
            s, b = block_step_times(events)
            steps += s
            logged += logged_step_times(events)
            batch = batch or b
        if steps:
            name = f"{system.parents[2].name}/{system.parent.name}"
            out[name] = SystemSteps(statistics.median(steps), batch, len(steps),
                                    statistics.median(logged) if logged else None, len(logged))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clones", nargs="+", type=Path, help="clones of training_results_vX.Y")
    ap.add_argument("--benchmark", default="gpt3")
    a = ap.parse_args(argv)
    systems = {root: system_step_times(root, a.benchmark) for root in a.clones}
    empty = [root for root, found in systems.items() if not found]
    for root in empty:
        print(f"mlperf_steps: no timed {a.benchmark} results under {root} (expected "
              f"SUBMITTER/results/SYSTEM/{a.benchmark}/result_*.txt)", file=sys.stderr)
    if empty:
        raise SystemExit(2)
    for root, found in systems.items():
        for name, s in found.items():
            logged = (f"  trainer's median {s.logged_step_s:.4f} s of {s.logged_steps} steps"
                      if s.logged_step_s is not None else "")
            print(f"{root.name:<22} {name:<48} global batch {s.batch:>5}  blocks {s.blocks:>3}  "
                  f"step {s.step_s:.4f} s{logged}")


if __name__ == "__main__":
    main()
