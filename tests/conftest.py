"""Shared helpers: run the real entry point (one process, or several under torchrun with gloo)
and read back what it measured."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.forked_ranks import run_ranks

REPO = Path(__file__).resolve().parents[1]

# Figures a test measured (e.g. dedup recall/precision), printed at the end of every run.
_REPORTED: list[str] = []


def report(line: str) -> None:
    _REPORTED.append(line)


@pytest.fixture(scope="module")
def one_process():
    """A one-rank gloo group with megatron-core's parallel state, for building real models in
    the test process; yields the platform. An in-memory store: no port, and nothing leaks into
    the environment of later runs."""
    import torch.distributed as dist

    # megatron-core only after megatron_lgs, whose import installs the platform layer first.
    from megatron.core import parallel_state

    from megatron_lgs.platform import get_platform

    platform = get_platform()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield platform
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def pytest_terminal_summary(terminalreporter) -> None:
    if _REPORTED:
        terminalreporter.section("measured by the tests")
        for line in _REPORTED:
            terminalreporter.write_line(line)

_PYTEST_PID = os.getpid()


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    """A runner's SIGTERM (a CI timeout) unwinds pytest as Ctrl-C does, so the fixtures that own
    network namespaces, Slurm daemons and rank processes still tear them down. A process forked
    from pytest keeps the default: SIGTERM ends it."""
    if os.getpid() != _PYTEST_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt


def pytest_configure(config) -> None:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


# A model small enough that a step takes milliseconds, still a real megatron-core GPT.
TINY_GPT = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
    "--vocab-size", "512", "--lr", "2e-3", "--min-lr", "2e-4",
    "--eval-interval", "1000", "--eval-iters", "1", "--log-interval", "5",
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    save_dir: Path | None

    def records(self, event: str) -> list[dict]:
        assert self.save_dir is not None, "metrics are written next to the checkpoints"
        path = self.save_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [r for r in map(json.loads, lines) if r["event"] == event]

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records("train")]

    def logged_losses(self) -> list[float]:
        """Each iteration's loss from the console (with --log-interval 1; no --save needed),
        as printed: 7 significant digits."""
        return [float(loss) for loss in _LOGGED_LOSS.findall(self.stdout)]


_LOGGED_LOSS = re.compile(r"iteration\s+\d+/\s*\d+ \|.*?\| lm loss: ([0-9.E+-]+) \|")


# Read when torch is imported, which the forkserver of tests/forked_ranks.py does once for all.
os.environ["TORCHDYNAMO_DISABLE"] = "1"


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHDYNAMO_DISABLE"] = "1"
    # Same thread count whatever the launcher, so runs that must agree bitwise do.
    env["OMP_NUM_THREADS"] = "1"
    # The repo first; then whatever the caller had (the GPU check's folder of carried wheels).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_pretrain(args: list[str], *, nproc: int = 1, save_dir: Path | None = None,
                 env: dict[str, str] | None = None, timeout: float = 600,
                 expect_success: bool = True, launcher: str | None = None,
                 module: str = "pretrain_gpt") -> Run:
    """Run pretrain_gpt.py (or another `module` that plays its part) on `nproc` ranks.
    `launcher`: "fork" forks the ranks from a process that has imported the trainer already
    (tests/forked_ranks.py: the same run, ~5 s of CPU less per rank); "user" runs it as a user
    would, `python` for one process and torchrun for several. Default: "fork", except where
    CUDA is present: the forkserver's imports leave CUDA initialized, which a forked process
    cannot use ("Cannot re-initialize CUDA in forked subprocess", on the GPU machine,
    2026-12-04)."""
    if launcher is None:
        import torch

        launcher = "user" if torch.cuda.is_available() else "fork"
    save_args = ["--save", str(save_dir)] if save_dir else ["--no-save"]
    full_env = _base_env()
    full_env.update(env or {})
    if launcher == "fork":
        code, stdout, stderr = run_ranks(module, [*args, *save_args], nproc, full_env, timeout)
    else:
        assert launcher == "user", launcher
        command = [sys.executable]
        if nproc > 1:
            command += ["-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={nproc}"]
        proc = subprocess.run(
            [*command, *([str(REPO / "pretrain_gpt.py")] if module == "pretrain_gpt"
                         else ["-m", module]), *args, *save_args],
            cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout,
            start_new_session=True)  # its own process group: fault injection kills the group
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    run = Run(code, stdout, stderr, save_dir)
    if expect_success and code != 0:
        raise AssertionError(f"pretrain_gpt.py failed ({code}):\n"
                             f"{stdout[-3000:]}\n{stderr[-5000:]}")
    return run


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tokenized corpus for the whole session (the cache is safe to share)."""
    return str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture
def tiny(data_cache: str) -> list[str]:
    return [*TINY_GPT, "--data-cache-dir", data_cache]


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group in this process, for code that asks for its rank."""
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()
