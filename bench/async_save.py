"""Training stall of an asynchronous checkpoint save (--async-save) against a synchronous save
of the same state.

One process trains a model whose checkpoint takes over a second to write here. Each round:
K plain steps (no save), a synchronous save, an asynchronous save of the same state followed by K
steps while its writer runs (committing it as soon as it is done), a blocking wait for it if it
is not, then K plain steps again. The stall of the asynchronous save is the time training
was blocked by it: the save call (planning, staging, fork) plus any wait for the writer. Also
printed: the extra time of the K steps it overlapped against the mean of the plain blocks
around it (the writer shares the CPU, and after the fork the first write to each page copies
it), and the ratio with it counted as stall too. Prints per-round figures, the medians, and
stall / synchronous save (target: <= 0.20).

    python bench/async_save.py [--rounds 5 --steps 8] [pretrain_gpt.py flags]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import megatron_lgs  # noqa: E402,F401  (prepares megatron-core for this machine)
import pretrain_gpt  # noqa: E402
from megatron_lgs import checkpointing  # noqa: E402
from megatron_lgs.arguments import parse_args  # noqa: E402
from megatron_lgs.training import Trainer  # noqa: E402

# ~27M parameters: model, fp32 Adam moments ~0.33 GB per checkpoint; a step well under a second.
MODEL = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
         "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "1",
         "--eval-iters", "0", "--log-interval", "1000000"]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    bench = argparse.ArgumentParser(prog=Path(__file__).name,
                                     description=__doc__.splitlines()[0])
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--steps", type=int, default=8, help="steps per block (K)")
    args, trainer_argv = bench.parse_known_args()
    root = Path(tempfile.mkdtemp(prefix="async-save-bench-"))
    try:
        cfg = parse_args([*MODEL, *trainer_argv, "--save", str(root / "async"), "--async-save",
                          "--train-iters", "1000000"], prog=bench.prog)
        trainer = Trainer(cfg, pretrain_gpt.model_provider, pretrain_gpt.forward_step,
                          pretrain_gpt.datasets_provider)
        sync_cfg = dataclasses.replace(cfg.checkpoint, save=str(root / "sync"))
        saves = trainer.async_saves
        batches = trainer._batches()
        state = trainer.state

        def block() -> float:
            started = time.perf_counter()
            for _ in range(args.steps):
                state.iteration += 1
                trainer.train_step(batches, state.iteration)
                saves.poll()  # what the training loop does every iteration
            return time.perf_counter() - started

        def save(ckpt_cfg, asynchronous: bool) -> float:
            started = time.perf_counter()
            checkpointing.save_checkpoint(ckpt_cfg, state, trainer.model, trainer.optimizer,
                                          trainer.scheduler, trainer.lgs,
                                          saves if asynchronous else None)
            return time.perf_counter() - started

        block()  # warm-up: first steps allocate the optimizer state
        save(sync_cfg, False)  # warm-up: first save imports and plans
        rows = []
        for r in range(args.rounds):
            plain_before = block()
            sync = save(sync_cfg, False)
            size = _size(checkpointing.checkpoint_dir(sync_cfg.save, state.iteration))
            held = save(cfg.checkpoint, True)
            overlapped = block()
            committed_in_block = saves.in_flight == 0
            started = time.perf_counter()
            saves.wait()
            waited = time.perf_counter() - started
            plain_after = block()
            baseline = (plain_before + plain_after) / 2
            stall = held + waited
            rows.append((sync, stall, held, overlapped - baseline, waited))
            print(f"round {r}: sync save {sync:.3f} s ({size / 1e6:.0f} MB) | async: held "
                  f"{held:.3f} s, overlapped {args.steps} steps +{overlapped - baseline:.3f} s "
                  f"(plain {baseline:.3f} s), wait {waited:.3f} s"
                  f"{'' if committed_in_block else ' (not done within the block)'} | stall "
                  f"{stall:.3f} s", flush=True)
            for kind in ("sync", "async"):
                shutil.rmtree(root / kind, ignore_errors=True)
        sync_median = statistics.median(r[0] for r in rows)
        stall_median = statistics.median(r[1] for r in rows)
        print(f"median synchronous save: {sync_median:.3f} s")
        slower = statistics.median(r[3] for r in rows)
        print(f"median async stall: {stall_median:.3f} s (held "
              f"{statistics.median(r[2] for r in rows):.3f} s, wait "
              f"{statistics.median(r[4] for r in rows):.3f} s); overlapped steps slower by "
              f"{slower:.3f} s")
        print(f"ratio async stall / sync save: {stall_median / sync_median:.3f}")
        print(f"ratio with the overlapped steps' slowdown counted: "
              f"{statistics.median((r[1] + r[3]) / r[0] for r in rows):.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
