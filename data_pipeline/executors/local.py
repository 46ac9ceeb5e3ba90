"""``--executor local --workers N``: a pool of N processes, each task in a process of its own
(forked from a server that has the pipeline imported, so a task neither imports anything nor
inherits an earlier task's heap: its peak RSS is its own). A stage with fewer tasks than workers
gives each task the idle workers' CPUs as tokenizer threads (the one-task `vocab` stage trains
with N threads). Stages run one after the other; the first failing task (in task order) stops
the run with its error."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from pathlib import Path

from data_pipeline.stages.task import run_task

# "__main__" too: the server imports the main script once, so a task's process does not
# import it again (spawn semantics), which costs seconds for a script that imports much.
_PRELOAD = ["__main__", "data_pipeline.executors.preload"]


# How often a wait checks that the pool can still finish its futures.
_POLL_S = 1.0


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def wait_on_pool(pool: ProcessPoolExecutor, futures: Sequence[Future], what: str,
                 return_when: str = ALL_COMPLETED) -> None:
    """``concurrent.futures.wait`` that raises instead of waiting forever when the pool can no
    longer finish the futures. The pool's manager thread is what completes them, or marks them
    broken when a worker dies; if that thread itself raises (in Python 3.11, for example while
    forking a replacement worker), the pending futures are never completed."""
    while True:
        done, pending = wait(futures, timeout=_POLL_S, return_when=return_when)
        if not pending or (return_when == FIRST_EXCEPTION and any(
                not f.cancelled() and f.exception() is not None for f in done)):
            return
        # CPython's private name (3.9 and later); test_local_executor.py pins it.
        manager = pool._executor_manager_thread
        if manager is None or manager.is_alive():
            continue
        # The thread also exits after completing the last future: look once more.
        pending = [f for f in futures if not f.done()]
        if pending:
            raise RuntimeError(
                f"the local process pool stopped with {len(pending)} of {len(futures)} {what} "
                "unfinished: its manager thread exited (a traceback above, if it raised, says why)")


class LocalExecutor:
    """``workers=0`` runs the tasks in this process, one by one (the trainer's embedded
    corpus, and quick in-process tests); the command line always uses a pool."""

    def __init__(self, workers: int) -> None:
        if workers < 0:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.workers = workers
        self.stats: dict[str, list[dict[str, float] | None]] = {}
        self._pool: ProcessPoolExecutor | None = None

    def run_stage(self, work: Path, stage: str, n_tasks: int) -> None:
        if self._pool is None:
            self.stats[stage] = [run_task(work, stage, i) for i in range(n_tasks)]
            return
        threads = max(1, self.workers // n_tasks)
        futures = [self._pool.submit(run_task, str(work), stage, i, threads)
                   for i in range(n_tasks)]
        what = f"{stage} tasks"
        wait_on_pool(self._pool, futures, what, FIRST_EXCEPTION)
        failed = [i for i, f in enumerate(futures)
                  if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            # The error reported is the first in keep order (what one worker would hit):
            # later tasks are dropped, earlier ones finish and may fail first.
            for other in futures[failed[0] + 1:]:
                other.cancel()
            wait_on_pool(self._pool, futures[:failed[0]], what)
            raise next(f.exception() for f in futures if f.exception() is not None)
        self.stats[stage] = [f.result() for f in futures]

    def run(self, work: Path, stages: Sequence[tuple[str, int]]) -> None:
        if self.workers:
            # max_tasks_per_child > 1 can deadlock on Python 3.11 (CPython gh-115634: a
            # stale idle-worker token stops replacement); with 1 no token is ever released.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_context(),
                                             max_tasks_per_child=1)
        try:
            for stage, n_tasks in stages:
                if n_tasks:
                    self.run_stage(work, stage, n_tasks)
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
                self._pool = None
