"""``--executor slurm``: each stage is one ``sbatch --array=0-(N-1)`` job whose elements run
``python -m data_pipeline.stages.task WORK STAGE $SLURM_ARRAY_TASK_ID``; stage k+1 waits for
stage k with ``--dependency=afterok`` (and ``--kill-on-invalid-dep=yes``, so a failed stage
cancels the rest). Each element logs to ``LOG_DIR/STAGE-INDEX.log``. All stages are submitted
at once (task counts are fixed by the plan), then this process polls ``scontrol`` (no
accounting database needed) and, if an element fails, cancels what is left and names its log.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from data_pipeline.executors import TaskFailed

_DONE = {"COMPLETED"}
_FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
           "DEADLINE", "PREEMPTED"}
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    cpus_per_task: int = 1
    mem: str | None = None  # --mem per task, e.g. "8G"
    time: str | None = None  # --time per task, e.g. "02:00:00"
    log_dir: str | None = None  # default: WORK/slurm-logs
    extra: tuple[str, ...] = field(default_factory=tuple)  # more sbatch flags, as given
    poll_seconds: float = 1.0


def _fields(record: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in record.split() if "=" in item)


class SlurmExecutor:
    def __init__(self, options: SlurmOptions) -> None:
        self.options = options

    def _sbatch(self, work: Path, stage: str, n_tasks: int, after: str | None,
                logs: Path) -> str:
        o = self.options
        script = work / "slurm" / f"{stage}.sbatch"
        script.parent.mkdir(exist_ok=True)
        path = shlex.quote(str(_REPO))
        script.write_text("#!/bin/bash\n"
                          f"export PYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                          f"echo \"{stage} task $SLURM_ARRAY_TASK_ID on node $SLURMD_NODENAME\"\n"
                          f"exec {shlex.quote(sys.executable)} -m data_pipeline.stages.task "
                          f"{shlex.quote(str(work))} {stage} \"$SLURM_ARRAY_TASK_ID\"\n")
        command = ["sbatch", "--parsable", f"--array=0-{n_tasks - 1}",
                   f"--job-name=prepare-{stage}", f"--output={logs}/{stage}-%a.log",
                   f"--cpus-per-task={o.cpus_per_task}", "--kill-on-invalid-dep=yes",
                   f"--chdir={work}"]
        if after is not None:
            command.append(f"--dependency=afterok:{after}")
        if o.partition:
            command.append(f"--partition={o.partition}")
        if o.mem:
            command.append(f"--mem={o.mem}")
        if o.time:
            command.append(f"--time={o.time}")
        proc = subprocess.run([*command, *o.extra, str(script)], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise TaskFailed(f"sbatch for stage {stage} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def _states(self, job: str) -> dict[int, tuple[str, str]] | None:
        """Array index -> (JobState, ExitCode) of every element Slurm has expanded; None
        while some are still pending as a range."""
        proc = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True,
                              text=True, timeout=60)
        states = {}
        for line in proc.stdout.splitlines():
            f = _fields(line)
            task = f.get("ArrayTaskId", "0")
            if not task.isdigit():
                return None
            states[int(task)] = (f.get("JobState", ""), f.get("ExitCode", ""))
        return states

    def _wait(self, job: str, stage: str, n_tasks: int, logs: Path) -> None:
        while True:
            states = self._states(job)
            if states is not None and len(states) == n_tasks and \
                    all(s in _DONE | _FAILED for s, _ in states.values()):
                # Judged when every element has ended, so the failure named is the first in
                # task order, as with the local executor.
                failed = sorted(i for i, (s, _) in states.items() if s in _FAILED)
                if failed:
                    i = failed[0]
                    log = logs / f"{stage}-{i}.log"
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:] \
                        if log.is_file() else ["(no log)"]
                    raise TaskFailed(f"stage {stage} task {i} {states[i][0].lower()} "
                                     f"(exit {states[i][1]}); log {log}: {tail[0] if tail else ''}")
                return
            time.sleep(self.options.poll_seconds)

    def run(self, work: Path, stages: Sequence[tuple[str, int]]) -> None:
        logs = Path(self.options.log_dir or work / "slurm-logs").resolve()
        logs.mkdir(parents=True, exist_ok=True)
        jobs: list[tuple[str, str, int]] = []
        after = None
        for stage, n_tasks in stages:
            if n_tasks:
                after = self._sbatch(work, stage, n_tasks, after, logs)
                jobs.append((after, stage, n_tasks))
        try:
            for job, stage, n_tasks in jobs:
                self._wait(job, stage, n_tasks, logs)
        except BaseException:
            subprocess.run(["scancel", *(job for job, _, _ in jobs)], capture_output=True,
                           timeout=60, env=os.environ)
            raise
