"""Feeding micro-batches to the schedule: which samples this data-parallel rank takes, in order,
from a given consumed-samples count. The dataset is map-style and each sample is a pure function
of its global index, so the stream restarts anywhere (resume) with any number of workers.

Megatron-LM's assignment: a global batch is cut into micro-batches of consecutive samples and
micro-batch j goes to data-parallel rank j % DP. The set of micro-batches is then the same for
every DP size, and so is anything computed per micro-batch rather than per token (MoE's
load-balancing loss): an MoE run with DP=2 follows the single-process run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator
from torch.utils.data import DataLoader, Dataset, Sampler

from data_pipeline import collate
from megatron_lgs.platform import FORK_MAY_DEADLOCK


def rank_micro_batches(start_sample: int, global_batch_size: int, micro_batch_size: int,
                       dp_rank: int, dp_size: int) -> list[list[int]]:
    """This rank's micro-batches (global sample indices) of the global batch at `start_sample`."""
    count = global_batch_size // micro_batch_size
    return [list(range(start_sample + j * micro_batch_size,
                       start_sample + (j + 1) * micro_batch_size))
            for j in range(dp_rank, count, dp_size)]


class BatchSizeSchedule:
    """The global batch size as a function of the samples consumed so far: --global-batch-size,
    or Megatron-LM's ramp-up computed by megatron-core's own calculator. A pure function of the
    consumed count, which a checkpoint restores: a resumed run continues the ramp exactly."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, dp_size: int,
                 rampup: tuple[int, int, int] | None = None) -> None:
        self.global_batch_size = global_batch_size
        self.calculator = None if rampup is None else RampupBatchsizeNumMicroBatchesCalculator(
            global_batch_size, micro_batch_size, dp_size, decrease_batch_size_if_needed=False,
            rank=0, start_global_batch_size=rampup[0], batch_size_increment=rampup[1],
            ramup_samples=rampup[2])

    def at(self, consumed_samples: int) -> int:
        if self.calculator is None:
            return self.global_batch_size
        self.calculator.update(consumed_samples, consistency_check=True)
        return self.calculator.get_current_global_batch_size()


class MicroBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches (lists of global sample indices), global batch after
    global batch, starting at `consumed_samples`. Endless: the trainer decides when to stop."""

    def __init__(self, consumed_samples: int, batch_sizes: BatchSizeSchedule,
                 micro_batch_size: int, dp_rank: int, dp_size: int) -> None:
        self.consumed_samples = consumed_samples
        self.batch_sizes = batch_sizes
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    def __iter__(self) -> Iterator[list[int]]:
        start = self.consumed_samples
        while True:
            size = self.batch_sizes.at(start)
            yield from rank_micro_batches(start, size, self.micro_batch_size, self.dp_rank,
                                          self.dp_size)
            start += size


def _fetch(dataset: Dataset, indices: list[int]) -> dict[str, torch.Tensor]:
    """A micro-batch; datasets with `__getitems__` (as DataLoader uses) look up all at once."""
    getitems = getattr(dataset, "__getitems__", None)
    return collate(getitems(indices) if getitems else [dataset[i] for i in indices])


def micro_batch_stream(dataset: Dataset, sampler: Sampler[list[int]],
                       num_workers: int) -> Iterator[dict[str, torch.Tensor]]:
    if num_workers == 0:
        return (_fetch(dataset, indices) for indices in sampler)
    # Samples need no worker seeds; a private generator keeps the DataLoader from drawing its
    # base seed from torch's global generator, which on CPU is also the dropout stream. Workers
    # are forks of this process, sharing the document index, except on a Python whose forks of
    # a process with gloo's threads can hang (FORK_MAY_DEADLOCK): there they come from a
    # forkserver, and each worker gets its own pickled copy of the index (~45 B per document).
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                        collate_fn=collate, persistent_workers=True,
                        multiprocessing_context="forkserver" if FORK_MAY_DEADLOCK else None,
                        generator=torch.Generator().manual_seed(0))
    return iter(loader)


def eval_micro_batches(eval_iters: int, global_batch_size: int, micro_batch_size: int,
                       dp_rank: int, dp_size: int) -> list[list[int]]:
    """This rank's micro-batches of the first `eval_iters` global batches."""
    return [batch for k in range(eval_iters)
            for batch in rank_micro_batches(k * global_batch_size, global_batch_size,
                                            micro_batch_size, dp_rank, dp_size)]


def fixed_batches(dataset: Dataset, batches: Sequence[list[int]]) -> Iterator[dict]:
    return (_fetch(dataset, indices) for indices in batches)
