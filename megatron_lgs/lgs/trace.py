"""A Chrome trace (chrome://tracing, Perfetto) of the gradient sync: when each bucket was
ready on the training thread and what each communication thread ran, for the first steps."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

THREADS = {"backward": 1, "intra-node": 2, "inter-node": 3}


class SyncTrace:
    """Events of steps [0, steps) of one rank; `step` is advanced by the engine. Appending to
    a list is atomic under the GIL, so the three threads record without a lock."""

    def __init__(self, directory: str | None, steps: int) -> None:
        self.directory = directory
        self.steps = steps
        self.step = 0
        self._events: list[dict] = []
        self._t0 = time.perf_counter()

    def _now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def on(self) -> bool:
        return bool(self.directory) and self.step < self.steps

    def event(self, name: str, phase: str, thread: str) -> None:
        if self.on():
            self._events.append({"name": name, "ph": phase, "ts": self._now_us(), "pid": 0,
                                 "tid": THREADS[thread], "s": "t",
                                 "args": {"step": self.step}})

    def span(self, name: str, thread: str) -> _Span:
        return _Span(self, name, thread)

    def write(self, rank: int) -> None:
        if not self._events or not self.directory:
            return
        directory = Path(self.directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": n}}
                 for n, tid in THREADS.items()]
        # The origin on the host's monotonic clock, so that ranks of one host can be drawn on
        # one time axis (`bench/lgs_trace_plot.py`).
        other = {"host": socket.gethostname(), "monotonic_origin_s": self._t0}
        (directory / f"lgs_trace_rank{rank:05d}.json").write_text(
            json.dumps({"traceEvents": names + self._events, "displayTimeUnit": "ms",
                        "otherData": other}))


class _Span:
    def __init__(self, trace: SyncTrace, name: str, thread: str) -> None:
        self.trace, self.name, self.thread = trace, name, thread

    def __enter__(self) -> None:
        self.start = self.trace._now_us()

    def __exit__(self, *exc) -> None:
        t = self.trace
        if t.on():
            t._events.append({"name": self.name, "ph": "X", "ts": self.start,
                              "dur": t._now_us() - self.start, "pid": 0,
                              "tid": THREADS[self.thread], "args": {"step": t.step}})
