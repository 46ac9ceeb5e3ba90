"""When to stop early: a signal (SIGTERM/SIGUSR1 from Slurm or a user) or a wall-clock budget.
Ranks agree before acting, since the save that follows is collective."""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist

from megatron_lgs.platform import get_platform

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class ExitConditions:
    def __init__(self, handle_signals: bool, duration_mins: float | None) -> None:
        self.received: int | None = None
        self.deadline = time.monotonic() + 60 * duration_mins if duration_mins else None
        self.enabled = handle_signals or self.deadline is not None
        if handle_signals:
            for sig in EXIT_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = signum  # acted on at the end of the current step

    def reason(self) -> str | None:
        """Collective: why every rank should stop now, or None to go on."""
        if not self.enabled:
            return None
        flags = torch.tensor([self.received is not None,
                              self.deadline is not None and time.monotonic() > self.deadline],
                             dtype=torch.int32, device=get_platform().device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0]:
            name = signal.Signals(self.received).name if self.received else "a signal"
            return f"received {name} (--exit-signal-handler)"
        if flags[1]:
            return "time budget spent (--exit-duration-in-mins)"
        return None
