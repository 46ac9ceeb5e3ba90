"""Start the ranks of a test run as forks of a process that has already imported the trainer.

A rank started by torchrun spends ~5 s of CPU importing torch, megatron-core and the trainer
before it does anything; a tiny test run then trains for well under a second. The test suite
starts a few hundred ranks, so on 2 cores the imports alone were most of its time. Here one
`torch.multiprocessing` forkserver per pytest session imports the trainer once
(`set_forkserver_preload`), and each run is a fork of it that plays the launcher's part:

- one rank is `python pretrain_gpt.py`: the environment as given, and the run is the leader of
  a new session, as `python` started with `start_new_session` (fault injection kills it);
- several ranks are torchrun's: each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  MASTER_ADDR/PORT and a session of its own; when one fails the others are stopped and the
  run exits 1.

Each rank runs `pretrain_gpt` as `__main__` and is a real process with its own gloo
connections; only the imports are shared. tests/distributed/test_launcher_parity.py checks
what the tests read (losses, exit status, messages) against python and torchrun.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch.multiprocessing as mp

_CONTEXT: mp.context.BaseContext | None = None
# Imported once by the forkserver: everything a rank of pretrain_gpt.py imports.
PRELOAD = ["tests.rank_preload"]
# How long the other ranks get to finish on their own after one rank failed (torchrun stops
# them at once; a short grace lets a rank that is printing its own error finish the line).
_FAILURE_GRACE_S = 2.0
# Sent to a run past its timeout before it is killed: each process prints its threads' stacks.
_STACKS_SIGNAL = signal.SIGUSR2  # SIGUSR1 and SIGTERM are the trainer's exit signals


class RunTimeout(subprocess.TimeoutExpired):
    """A run past its timeout; its message ends with what the ranks printed, stacks included."""

    def __str__(self) -> str:
        return (f"{super().__str__()}\n--- stdout (tail) ---\n{self.output[-3000:]}"
                f"\n--- stderr (tail, with every process's stacks) ---\n{self.stderr[-12000:]}")


def _context() -> mp.context.BaseContext:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_rank(module: str, argv: list[str], env: dict[str, str], out: Path, err: Path) -> None:
    """In the forked rank: become `python -m module argv...` with `env`, then exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    os.environ.clear()
    os.environ.update(env)
    # A run that hangs is asked for every thread's stack (its helper processes inherit this).
    faulthandler.register(_STACKS_SIGNAL, all_threads=True)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [module, *argv]
    code = 0
    try:
        # alter_sys: the script is sys.modules["__main__"], as when Python runs it.
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _leader(module: str, argv: list[str], nproc: int, env: dict[str, str], outdir: str) -> None:
    """torchrun's part, in a fork of the forkserver: start the ranks, wait, report."""
    os.setsid()
    signal.signal(_STACKS_SIGNAL, signal.SIG_IGN)  # the ranks print stacks; the launcher has none
    port = str(free_port())
    pids: dict[int, int] = {}
    for rank in range(nproc):
        # One rank is `python script`: the environment as given. Several get torchrun's.
        rank_env = env if nproc == 1 else {
            **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port}
        pid = os.fork()
        if pid == 0:
            if nproc > 1:  # torchrun starts each rank in a session of its own
                os.setsid()
            _run_rank(module, argv, rank_env, Path(outdir, f"{rank}.out"),
                      Path(outdir, f"{rank}.err"))
        pids[pid] = rank
    Path(outdir, "pids").write_text("".join(f"{pid}\n" for pid in pids))
    codes: dict[int, int] = {}
    failed_at: float | None = None
    while len(codes) < nproc:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if failed_at is not None and time.monotonic() - failed_at > _FAILURE_GRACE_S:
                for other in pids:
                    if pids[other] not in codes:
                        os.kill(other, signal.SIGKILL)
            time.sleep(0.01)
            continue
        code = os.waitstatus_to_exitcode(status)
        codes[pids[pid]] = code
        if code != 0 and failed_at is None:
            failed_at = time.monotonic()
    first_failure = next((codes[r] for r in sorted(codes) if codes[r] != 0), 0)
    if nproc > 1:  # torchrun exits 1 whatever its failed rank's status
        os._exit(1 if first_failure else 0)
    if first_failure < 0:  # killed by a signal: so is the run, as `python` would be
        signal.signal(-first_failure, signal.SIG_DFL)
        os.kill(os.getpid(), -first_failure)
    os._exit(first_failure)


def run_ranks(module: str, argv: list[str], nproc: int, env: dict[str, str],
              timeout: float) -> tuple[int, str, str]:
    """Run `python -m module argv` on `nproc` ranks: (exit status as subprocess reports it,
    stdout, stderr), the ranks' outputs concatenated in rank order. A run past `timeout` is
    killed with its process group and raises subprocess.TimeoutExpired."""
    with tempfile.TemporaryDirectory(prefix="ranks-") as outdir:
        leader = _context().Process(target=_leader,
                                    args=(module, argv, nproc, env, outdir))
        leader.start()
        leader.join(timeout)
        timed_out = leader.exitcode is None
        pids = Path(outdir, "pids")
        groups = [leader.pid, *map(int, pids.read_text().split() if pids.exists() else [])]
        if timed_out:
            _signal_groups(groups, _STACKS_SIGNAL)
            time.sleep(2)
        # Whatever is left of the run's process groups (the leader's, each rank's) goes.
        _signal_groups(groups, signal.SIGKILL)
        leader.join()
        outputs = []
        for suffix in ("out", "err"):
            outputs.append("".join(
                Path(outdir, f"{rank}.{suffix}").read_text(errors="replace")
                for rank in range(nproc) if Path(outdir, f"{rank}.{suffix}").exists()))
        if timed_out:
            raise RunTimeout([module, *argv], timeout, output=outputs[0], stderr=outputs[1])
        return leader.exitcode, outputs[0], outputs[1]


def _signal_groups(groups: list[int], sig: signal.Signals) -> None:
    for pid in groups:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
