"""LGS's communication threads: one FIFO thread per hop and process (`worker`), shared by every
engine, and the first failure any of them met (`first_error`)."""

from __future__ import annotations

import queue
import threading


class Worker:
    """A FIFO communication thread, one per hop and process, shared by every engine: each
    group's collectives then run in the same order on every rank, whatever the number of model
    chunks. A job may return a follow-up (worker, job) that inherits its `done`: a bucket's
    intra-node hop hands it to the inter-node thread, so bucket k crosses the slow link while
    bucket k+1 is reduced inside the node."""

    def __init__(self, hop: str) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"lgs-{hop}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job, done = self.jobs.get()
            follow = None
            try:
                if first_error() is None:
                    follow = job()
            except BaseException as exc:  # surfaced on the training thread in finish()
                self.error = exc
            if follow is None:
                done()
            else:
                target, next_job = follow
                target.jobs.put((next_job, done))


_WORKERS: dict[str, Worker] = {}
HOPS = ("intra-node", "inter-node")


def worker(hop: str) -> Worker:
    if hop not in _WORKERS:
        _WORKERS[hop] = Worker(hop)
    return _WORKERS[hop]


def first_error() -> BaseException | None:
    """The first failure of any communication thread (raised on the training thread)."""
    return next((w.error for w in _WORKERS.values() if w.error is not None), None)
