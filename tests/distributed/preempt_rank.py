"""A stand-in for a pretrain_gpt.py rank in launch/slurm/pretrain_gpt.sbatch's preemption path,
for repeating that path cheaply: the first start waits for SIGTERM, "saves" (writes a file) and
exits 0, as `--exit-signal-handler` does; a requeued start (SLURM_RESTART_COUNT >= 1) finishes at
once. Arguments (the script's pretrain_gpt.py flags) are ignored; STANDIN_DIR names the folder
for its marker files."""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> int:
    folder = os.environ["STANDIN_DIR"]
    rank = os.environ.get("SLURM_PROCID", "0")
    if int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
        open(f"{folder}/finished{rank}", "w").close()
        return 0
    signalled: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: signalled.append(signum))
    open(f"{folder}/ready{rank}", "w").close()
    while not signalled:
        time.sleep(0.05)
    time.sleep(0.3)  # about what a tiny checkpoint takes
    open(f"{folder}/saved{rank}", "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
