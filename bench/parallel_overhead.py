"""What parallel layouts cost and save on this machine, against one process in the same run.

Each layout is a real `pretrain_gpt.py` run (torchrun, gloo on CPU) with the same model, seed
and global batch. Prints, from each run's own start-up memory report (measured from the tensors
every rank holds), the memory-per-rank table for DP = 1/2/4 with and without the distributed
optimizer and with Megatron-FSDP's ZeRO-3, and each layout's mean step time relative to the
single-process reference (informative: on a CPU the ranks share the cores).

    python bench/parallel_overhead.py [--layouts dp1,dp2,...] [--iters 20] [trainer flags]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "16",
         "--vocab-size", "512", "--eval-iters", "0", "--eval-interval", "100000"]

ZERO1 = ["--use-distributed-optimizer"]
ZERO3 = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]

# name -> (processes, flags)
LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "dp1": (1, []),
    "dp2": (2, []),
    "dp2-zero1": (2, ZERO1),
    "dp2-zero3": (2, ZERO3),
    "dp4": (4, []),
    "dp4-zero1": (4, ZERO1),
    "dp4-zero3": (4, ZERO3),
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
}

_MEMORY = re.compile(r"memory per rank at start-up \(MB\): parameters (\S+) \| gradients (\S+) "
                     r"\| optimizer state (\S+) \|")
_STEP = re.compile(r"elapsed time per iteration \(ms\): ([\d.]+)")


@dataclass
class Result:
    name: str
    nproc: int
    memory: tuple[str, str, str]  # MB per rank: parameters, gradients, optimizer state
    step_ms: float


def run_layout(name: str, extra: list[str], iters: int) -> Result:
    nproc, flags = LAYOUTS[name]
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}"]
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    # Two log intervals: the first absorbs the warm-up, the second is timed.
    argv = [*MODEL, *extra, *flags, "--train-iters", str(2 * iters), "--log-interval",
            str(iters), "--no-save"]
    # Its own process group, so that a layout that hangs is stopped with all its ranks.
    with subprocess.Popen([*launcher, str(REPO / "pretrain_gpt.py"), *argv], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise SystemExit(f"{name}: no result within 600 s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{stderr[-3000:]}")
    memory = _MEMORY.search(stdout)
    steps = _STEP.findall(stdout)
    assert memory and len(steps) == 2, stdout[-2000:]
    return Result(name, nproc, memory.groups(), float(steps[-1]))


def main() -> None:
    bench = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_argument("--layouts", default=",".join(LAYOUTS))
    bench.add_argument("--iters", type=int, default=20, help="timed iterations per layout")
    args, trainer_argv = bench.parse_known_args()
    names = args.layouts.split(",")
    unknown = set(names) - set(LAYOUTS)
    if unknown or "dp1" not in names:
        raise SystemExit(f"--layouts: choose from {', '.join(LAYOUTS)} (dp1, the reference, "
                         f"is required); unknown: {', '.join(sorted(unknown)) or '-'}")
    started = time.perf_counter()
    results = {name: run_layout(name, trainer_argv, args.iters) for name in names}
    reference = results["dp1"].step_ms

    print(f"model: {' '.join(MODEL + trainer_argv)}")
    print(f"{os.cpu_count()} CPU cores; every rank runs one thread\n")
    print("memory per rank at start-up (MB, measured from the tensors; min..max over ranks)")
    print(f"{'layout':<12}{'ranks':>6}{'parameters':>14}{'gradients':>14}{'optimizer':>14}"
          f"{'total':>10}")
    for r in results.values():
        total = sum(float(v.split("..")[-1]) for v in r.memory)
        print(f"{r.name:<12}{r.nproc:>6}{r.memory[0]:>14}{r.memory[1]:>14}{r.memory[2]:>14}"
              f"{total:>10.2f}")
    print(f"\nmean step time over {args.iters} iterations after {args.iters} of warm-up "
          f"(informative: the ranks share {os.cpu_count()} cores)")
    print(f"{'layout':<12}{'ranks':>6}{'step (ms)':>12}{'vs 1 process':>14}")
    for r in results.values():
        print(f"{r.name:<12}{r.nproc:>6}{r.step_ms:>12.1f}{r.step_ms / reference:>13.2f}x")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
