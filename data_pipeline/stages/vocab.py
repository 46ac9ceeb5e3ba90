"""Stage 7, one task: the tokenizer. ``--tokenizer FILE`` is copied; ``--vocab-size N`` trains a
byte-level BPE on the kept texts, streamed partition by partition in keep order (the trainer
holds word counts, not texts).

About ``--vocab-sample-bytes`` of text is trained on: when the corpus accepted more, every
partition gives the same share of its accepted bytes (its first documents, in keep order),
less the duplicates among them. The one task's time and its word counts then stop growing with
the corpus, a sample spread over every partition sees every domain and every part of each, and
the task reads each partition's offsets and each dedup output once (not once per partition)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from data_pipeline.manifest import TOKENIZER_FILE
from data_pipeline.sources import InputError
from data_pipeline.stages.common import Plan, Texts, partition_rows, read_json, task_dir
from data_pipeline.stats import summary_table
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer


def tasks(plan: Plan) -> int:
    return 1


def sample_prefix(offsets: np.ndarray, share: float) -> int:
    """How many of a partition's first documents (``offsets``: their byte boundaries) start
    inside ``share`` of its bytes: about that share, rounded up to a whole document."""
    if share >= 1.0:
        return len(offsets) - 1
    return int(np.searchsorted(offsets[:-1], share * offsets[-1]))


def _removed(work: Path, plan: Plan, starts: np.ndarray, take: np.ndarray) -> np.ndarray:
    """Rows inside the sampled prefixes that exact or near dedup removed, sorted."""
    found = []
    for path in [*(task_dir(work, "exact", t) / "dups.npy" for t in range(plan.exact_tasks)),
                 task_dir(work, "clusters", 0) / "near.npy"]:
        rows = np.load(path)["row"]
        p = np.searchsorted(starts, rows, side="right") - 1
        found.append(rows[rows - starts[p] < take[p]])
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def _sampled_rows(work: Path, plan: Plan) -> Iterator[np.ndarray]:
    """Each partition's sampled kept rows (global), in keep order."""
    starts = partition_rows(work, plan)
    n = len(plan.partitions)
    total = sum(os.path.getsize(task_dir(work, "read", p) / "texts.bin") for p in range(n))
    cap = plan.vocab_sample_bytes
    share = 1.0 if not cap or total <= cap else cap / total
    take = np.array([sample_prefix(np.load(task_dir(work, "read", p) / "offsets.npy"), share)
                     for p in range(n)], dtype=np.int64)
    removed = _removed(work, plan, starts, take)
    for p in range(n):
        rows = np.arange(starts[p], starts[p] + take[p])
        yield rows[~np.isin(rows, removed, assume_unique=True)]


def _kept_texts(work: Path, plan: Plan) -> Iterator[str]:
    with Texts(work, partition_rows(work, plan), max_open=1) as texts:  # partition by partition
        for sampled in _sampled_rows(work, plan):
            rows = sampled.tolist()
            for lo in range(0, len(rows), 1024):
                yield from texts.get(rows[lo:lo + 1024])


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    if sum(read_json(task_dir(work, "clusters", 0) / "keep.json")["kept"]) == 0:
        from data_pipeline.stages.finalize import counts_of  # finalize imports this module

        raise InputError("no document survived filtering and deduplication:\n"
                         + summary_table(counts_of(work, plan, written=False)))
    if plan.tokenizer is not None:
        tokenizer = load_tokenizer(plan.tokenizer)
    else:
        assert plan.vocab_size is not None  # PrepareConfig requires one of the two
        tokenizer = train_bpe_tokenizer(_kept_texts(work, plan), plan.vocab_size)
    eod_id(tokenizer)
    tokenizer.save(str(out / TOKENIZER_FILE))
