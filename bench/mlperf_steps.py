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
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MLLOG = ":::MLLOG"


def block_step_times(log: str) -> tuple[list[float], int | None]:
    """(step time of each timed block, global batch size) of one result file."""
    batch = seq = None
    starts: dict[int, tuple[int, int]] = {}
    block_ms: int | None = None  # samples-count logs: the open block's start
    ended: float | None = None  # its duration, s, until the evaluation after it counts it
    evaluated = 0  # samples trained before the last evaluation
    steps: list[float] = []
    for line in log.splitlines():
        if MLLOG not in line:
            continue
        event = json.loads(line.split(MLLOG, 1)[1])
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


def system_step_times(root: Path, benchmark: str = "gpt3") -> dict[str, tuple[float, int, int]]:
    """{submitter/system: (median step s, global batch, blocks)} for one results clone."""
    out = {}
    for system in sorted(root.glob(f"*/results/*/{benchmark}")):
        steps, batch = [], None
        for result in sorted(system.glob("result_*.txt")):
            s, b = block_step_times(result.read_text(errors="replace"))
            steps += s
            batch = batch or b
        if steps:
            name = f"{system.parents[2].name}/{system.parent.name}"
            out[name] = (statistics.median(steps), batch, len(steps))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clones", nargs="+", type=Path, help="clones of training_results_vX.Y")
    ap.add_argument("--benchmark", default="gpt3")
    a = ap.parse_args(argv)
    for root in a.clones:
        for name, (step, batch, blocks) in system_step_times(root, a.benchmark).items():
            print(f"{root.name:<22} {name:<48} global batch {batch:>5}  blocks {blocks:>3}  "
                  f"step {step:.4f} s")


if __name__ == "__main__":
    main()
