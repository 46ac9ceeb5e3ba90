"""Which samples a data-parallel rank takes, and how samples become a batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def global_batch_indices(
    start_sample: int, global_batch_size: int, dp_rank: int, dp_size: int
) -> list[int]:
    """Indices in [start_sample, start_sample + global_batch_size) owned by dp_rank.

    Rank r takes the indices congruent to r mod dp_size, so the ranks partition
    each global batch and the assignment depends only on the sample counter.
    """
    for name, value in (
        ("start_sample", start_sample),
        ("global_batch_size", global_batch_size),
        ("dp_rank", dp_rank),
        ("dp_size", dp_size),
    ):
        _check_int(name, value)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank must be in [0, {dp_size}), got {dp_rank}")
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if global_batch_size % dp_size != 0:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by dp_size {dp_size}"
        )
    if start_sample < 0:
        raise ValueError(f"start_sample must be >= 0, got {start_sample}")
    if start_sample % dp_size != 0:
        raise ValueError(
            f"start_sample {start_sample} is not a multiple of dp_size {dp_size}"
        )
    return list(
        range(start_sample + dp_rank, start_sample + global_batch_size, dp_size)
    )


def collate(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    keys = samples[0].keys()
    if any(s.keys() != keys for s in samples):
        raise ValueError("all samples must have the same keys")
    return {k: torch.stack([s[k] for s in samples]) for k in keys}
