"""One task of one stage: ``python -m data_pipeline.stages.task WORK STAGE INDEX`` (what a Slurm
array element runs; the local executor calls ``run_task`` in its worker processes).

A task whose marker is valid is skipped; otherwise it runs into a fresh temporary directory
and commits (see ``common``). Peak memory and time go to ``STAGE/NNNNN.stats.json``, beside
the outputs and not among them.
"""

from __future__ import annotations

import importlib
import os
import resource
import sys
import time
from pathlib import Path

from data_pipeline.stages.common import begin, commit, is_complete, load_plan, write_json


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so tasks run one after another in one
    process (the in-process executor) report each its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _tokenizer_threads(threads: int) -> None:
    """The tokenizer library's threads for this process (read when it first tokenizes, so a
    task process must not have tokenized before); a user's own setting wins."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if threads > 1 else "false")
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


def run_task(work: str | Path, stage: str, index: int,
             threads: int = 1) -> dict[str, float] | None:
    """Run (or skip, when already complete) one task with ``threads`` CPUs; its stats, or None
    when skipped."""
    work = Path(work)
    if is_complete(work, stage, index):
        return None
    _tokenizer_threads(threads)
    _reset_peak_rss()
    start = time.perf_counter()
    plan = load_plan(work)
    module = importlib.import_module(f"data_pipeline.stages.{stage}")
    tmp = begin(work, stage, index)
    module.run(plan, work, index, tmp)
    commit(work, stage, index, tmp)
    stats = {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb(),
             "threads": threads, "pid": os.getpid()}
    write_json(work / stage / f"{index:05d}.stats.json", stats)
    return stats


def main(argv: list[str]) -> int:
    from data_pipeline.manifest import DatasetError
    from data_pipeline.sources import InputError

    work, stage, index = argv
    try:
        run_task(work, stage, int(index), int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    except (InputError, DatasetError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
