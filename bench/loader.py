"""Tokens per second the blended, packed loader delivers, next to what the model consumes.

Prepares the embedded CPython corpus (domains ``code`` and ``prose``) with
``python -m data_pipeline prepare`` into a temporary directory (or reads ``--dataset DIR``),
then reads micro-batches through ``BlendedDataset.__getitems__`` + ``collate`` in this process,
the trainer's path with ``--num-workers 0``.

    python bench/loader.py [--model-tokens-per-s 12000 --seq-length 128 --micro-batch 8]

Prints loader tokens/s and its ratio to the model's tokens/s (target: >= 100x). The default
12,000 tokens/s is the tiny GPT's training throughput measured on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_pipeline import collate  # noqa: E402
from data_pipeline.embedded import prepare_embedded  # noqa: E402
from data_pipeline.loader import LoaderConfig, blend_domains  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, help="a prepared dataset (default: build one)")
    parser.add_argument("--weights", default="code=0.7,prose=0.3")
    parser.add_argument("--model-tokens-per-s", type=float, default=12_000)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    weights = {k: float(v) for k, v in (item.split("=") for item in args.weights.split(","))}

    with tempfile.TemporaryDirectory() as tmp:
        dataset_dir = args.dataset or prepare_embedded(tmp, args.vocab_size)
        ds = blend_domains([dataset_dir], weights, LoaderConfig(args.seq_length))
        # Start far into the run so epochs > 0 are exercised too.
        sample = 3 * len(ds)
        samples = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            batch = collate(ds.__getitems__(list(range(sample, sample + args.micro_batch))))
            sample += args.micro_batch
            samples += len(batch["tokens"])
        elapsed = time.perf_counter() - start
    tokens_per_s = samples * args.seq_length / elapsed
    print(f"loader: {tokens_per_s:,.0f} tokens/s ({samples / elapsed:,.0f} samples/s of "
          f"{args.seq_length} tokens, micro-batch {args.micro_batch}, weights {weights})")
    print(f"model:  {args.model_tokens_per_s:,.0f} tokens/s")
    print(f"ratio:  {tokens_per_s / args.model_tokens_per_s:.0f}x (target >= 100x)")


if __name__ == "__main__":
    main()
