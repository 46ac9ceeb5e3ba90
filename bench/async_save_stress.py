"""Stress of --async-save's forks: the sequence of tests/distributed/test_zero3_async_checkpoints.py
(ZeRO-3 DP=2 resumed from iteration 10, SIGKILLed while the save of 15 is in flight, resumed to
20) repeated RUNS times. A resumed run that does not finish within --timeout is reported as a
hang with every process's stacks (written to OUT/hang_N.txt), and the loop goes on.

    python bench/async_save_stress.py [--runs 60] [--timeout 30] [--out /tmp/async_stress]

Not a test: a hang is rare (CPython gh-112275, see megatron_lgs/async_save.py), so it takes many
runs to see one; it prints the count at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_lgs.checkpointing import FAULT_ENV, latest_iteration  # noqa: E402
from tests.conftest import TINY_GPT, run_pretrain  # noqa: E402
from tests.distributed.test_zero3_async_checkpoints import RUN, ZERO3  # noqa: E402
from tests.forked_ranks import RunTimeout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/async_stress"))
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    tiny = [*TINY_GPT, "--data-cache-dir", str(a.out / "cache")]
    base = a.out / "killed_at_10"
    run_pretrain([*tiny, *RUN, *ZERO3], nproc=2, save_dir=base, expect_success=False,
                 env={FAULT_ENV: "save:after_commit@10"})
    assert latest_iteration(str(base)) == 10, "the base run did not commit iteration 10"
    hangs = 0
    for i in range(a.runs):
        save = a.out / "run"
        shutil.rmtree(save, ignore_errors=True)
        shutil.copytree(base, save)
        args = [*tiny, *RUN, *ZERO3, "--async-save", "--load", str(save)]
        started = time.perf_counter()
        try:
            run_pretrain(args, nproc=2, save_dir=save, expect_success=False,
                         env={FAULT_ENV: "save:in_flight@15"}, timeout=a.timeout)
            run_pretrain(args, nproc=2, save_dir=save, timeout=a.timeout)
        except RunTimeout as exc:
            hangs += 1
            (a.out / f"hang_{i}.txt").write_text(str(exc))
            print(f"run {i}: HANG, stacks in {a.out / f'hang_{i}.txt'}", flush=True)
            continue
        print(f"run {i}: {time.perf_counter() - started:.1f} s, committed "
              f"{latest_iteration(str(save))}", flush=True)
    print(f"{hangs} hang(s) in {a.runs} runs")


if __name__ == "__main__":  # the ranks' forkserver imports this file: run only as the script
    main()
