"""What our trainer's step costs over calling megatron-core directly.

Same process, same model, optimizer and batch size: blocks of our `Trainer.train_step` (data
from the blended map-style dataset, loss reduction over data parallel, the stability verdict
inside the optimizer step, scheduler) interleaved with blocks of a minimal loop (zero grads ->
megatron's forward_backward_func on one pre-built batch -> optimizer.step). Prints the median
step time of each and their ratio (target: <= 1.10).

    python bench/step_overhead.py [--blocks 8 --block-steps 10] [pretrain_gpt.py flags]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import megatron_lgs  # noqa: E402,F401  (prepares megatron-core for this machine)
import pretrain_gpt  # noqa: E402
from megatron_lgs import data  # noqa: E402
from megatron_lgs.arguments import parse_args  # noqa: E402
from megatron_lgs.training import Trainer  # noqa: E402


def main() -> None:
    bench = argparse.ArgumentParser(prog=Path(__file__).name,
                                     description=__doc__.splitlines()[0])
    bench.add_argument("--blocks", type=int, default=8)
    bench.add_argument("--block-steps", type=int, default=10)
    args, trainer_argv = bench.parse_known_args()
    cfg = parse_args([*trainer_argv, "--no-save", "--train-iters", "100000"], prog=bench.prog)
    trainer = Trainer(cfg, pretrain_gpt.model_provider, pretrain_gpt.forward_step,
                      pretrain_gpt.datasets_provider)

    t = cfg.training
    sampler = data.MicroBatchSampler(0, trainer.batch_sizes, t.micro_batch_size,
                                     trainer.dp_rank, trainer.dp_size)
    ours_batches = data.micro_batch_stream(trainer.datasets.train, sampler, 0)
    fixed = next(data.micro_batch_stream(trainer.datasets.train, sampler, 0))

    iterations = iter(range(1, 10**9))

    def ours() -> None:
        trainer.train_step(ours_batches, next(iterations))

    def minimal() -> None:
        for chunk in trainer.model:
            chunk.zero_grad_buffer()
        trainer.optimizer.zero_grad()
        trainer.forward_backward(
            forward_step_func=pretrain_gpt.forward_step,
            data_iterator=iter([fixed] * trainer.num_microbatches), model=trainer.model,
            num_microbatches=trainer.num_microbatches, seq_length=cfg.model.seq_length,
            micro_batch_size=t.micro_batch_size, forward_only=False)
        trainer.optimizer.step()

    def block(step) -> float:
        start = time.perf_counter()
        for _ in range(args.block_steps):
            step()
        return (time.perf_counter() - start) / args.block_steps

    block(ours), block(minimal)  # warm-up: allocator, lazily created optimizer state
    times: dict[str, list[float]] = {"ours": [], "minimal": []}
    for _ in range(args.blocks):
        times["ours"].append(block(ours))
        times["minimal"].append(block(minimal))
    ours_ms = 1000 * statistics.median(times["ours"])
    minimal_ms = 1000 * statistics.median(times["minimal"])
    print(f"model: {cfg.model.num_layers} layers, hidden {cfg.model.hidden_size}, seq "
          f"{cfg.model.seq_length}, global batch {t.global_batch_size}, micro-batch "
          f"{t.micro_batch_size}, world size {cfg.parallel.world_size}")
    print(f"median step over {args.blocks} interleaved blocks of {args.block_steps}: "
          f"trainer {ours_ms:.2f} ms, minimal megatron-core loop {minimal_ms:.2f} ms")
    print(f"ratio trainer/minimal: {ours_ms / minimal_ms:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
