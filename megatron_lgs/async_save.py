"""--async-save: checkpoint writers forked while training goes on, kept from hanging at the fork.

megatron-core's AsyncCallsQueue forks one writer per save (TemporalAsyncCaller); the fork is the
snapshot, and training then changes only its own pages. A fork of a process whose other threads
call into Python can leave the child stuck before it runs a line: gloo's worker threads release
tensors that Python objects own and create a Python thread state to do so, without the GIL but
under the interpreter's thread-state lock (gdb on a ZeRO-3 rank: ~40 per second). A child forked
while one does waits on that lock forever on Python before 3.11.10 (CPython gh-112275;
`platform.FORK_MAY_DEADLOCK`). Two defences, kept on every Python because they cost nothing:

- the server of the writers' results queue is forked when `AsyncSaves` is built, which the
  trainer does before the process group (and its threads) exists;
- each writer announces itself on a pipe as its first act; one that stays silent for
  `START_TIMEOUT_S` is killed and forked again. The parent has not moved on, so the new fork is
  the same snapshot.
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
from collections.abc import Callable

import torch.distributed as dist
from megatron.core.dist_checkpointing.strategies.async_utils import (
    AsyncCallsQueue,
    AsyncRequest,
    TemporalAsyncCaller,
)

from megatron_lgs.platform import use_forked_save_queue

# A healthy writer announces itself within milliseconds; a stuck one never does.
START_TIMEOUT_S = 20.0
START_ATTEMPTS = 3


def _announce_then_run(announce, write: Callable, *args, **kwargs) -> None:
    """The writer's body: say it runs, then write."""
    announce.send_bytes(b"1")
    announce.close()
    write(*args, **kwargs)


class AnnouncedWriter(TemporalAsyncCaller):
    """megatron-core's forked writer, re-forked when the child never starts."""

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        if async_req.async_fn is None:
            super().schedule_async_call(async_req)
            return
        for attempt in range(1, START_ATTEMPTS + 1):
            heard, announce = multiprocessing.Pipe(duplex=False)
            super().schedule_async_call(async_req._replace(
                async_fn=functools.partial(_announce_then_run, announce, async_req.async_fn)))
            announce.close()
            started = heard.poll(START_TIMEOUT_S)  # also true when the child exited at once
            heard.close()
            if started:
                return
            self.process.kill()
            self.process.join()
            self.process = None
            print(f" rank {dist.get_rank()}: the checkpoint writer forked for save call "
                  f"{async_req.call_idx} did not start within {START_TIMEOUT_S:.0f} s (a fork "
                  f"deadlock, CPython gh-112275); killed it, attempt {attempt} of "
                  f"{START_ATTEMPTS}", file=sys.stderr, flush=True)
        raise RuntimeError(f"--async-save: no checkpoint writer started in {START_ATTEMPTS} "
                           f"forks of {START_TIMEOUT_S:.0f} s each")


class _AnnouncedCallsQueue(AsyncCallsQueue):
    def _get_async_caller(self) -> AnnouncedWriter:
        return AnnouncedWriter()


class AsyncSaves:
    """megatron-core's queue of asynchronous saves, with writers that announce themselves. A
    save's commit (dist_checkpointing's metadata, then our run state, layout, rename and tracker)
    runs in `poll` or `wait` once every rank's writer has finished. Both are collective: every
    rank calls them at the same points of the loop. Build it before the process group."""

    def __init__(self) -> None:
        use_forked_save_queue()
        self.calls = _AnnouncedCallsQueue(persistent=False)

    def poll(self) -> None:
        """Commit the saves whose writes are complete on every rank, without waiting."""
        self.calls.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        """Commit every save in flight, waiting for its writers."""
        self.calls.maybe_finalize_async_calls(blocking=True)

    @property
    def in_flight(self) -> int:
        return self.calls.get_num_unfinalized_calls()
