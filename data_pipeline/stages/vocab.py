"""Stage 7, one task: the tokenizer. ``--tokenizer FILE`` is copied; ``--vocab-size N`` trains a
byte-level BPE on the kept texts, streamed partition by partition in keep order (the trainer
holds word counts, not texts).

About ``--vocab-sample-bytes`` of kept text is trained on: when the corpus keeps more, every
partition gives the same share of its kept bytes, its first documents in keep order. The one
task's time and its word counts then stop growing with the corpus, and a sample spread over
every partition sees every domain and every part of each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from data_pipeline.manifest import TOKENIZER_FILE
from data_pipeline.sources import InputError
from data_pipeline.stages.clusters import kept_rows
from data_pipeline.stages.common import Plan, Texts, partition_rows, read_json, task_dir
from data_pipeline.stats import summary_table
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer


def tasks(plan: Plan) -> int:
    return 1


def sample_rows(kept: list[np.ndarray], sizes: list[np.ndarray], cap: int) -> list[np.ndarray]:
    """Of each partition's kept rows (with their sizes in bytes), the first ones that start
    inside the partition's share of its bytes: ``cap`` over the total, or all when the total is
    within ``cap`` or ``cap`` is 0. So about ``cap`` bytes, each partition's share rounded up
    to a whole document."""
    total = sum(int(s.sum()) for s in sizes)
    if not cap or total <= cap:
        return list(kept)
    share = cap / total
    return [rows[:int(np.searchsorted(np.cumsum(size) - size, share * size.sum()))]
            for rows, size in zip(kept, sizes, strict=True)]


def _kept_texts(work: Path, plan: Plan) -> Iterator[str]:
    starts = partition_rows(work, plan)
    texts = Texts(work, starts)
    kept = [kept_rows(work, plan, p, starts) for p in range(len(plan.partitions))]
    sizes = [np.diff(np.load(task_dir(work, "read", p) / "offsets.npy"))[rows]
             for p, rows in enumerate(kept)]
    for p, sampled in enumerate(sample_rows(kept, sizes, plan.vocab_sample_bytes)):
        rows = (sampled + starts[p]).tolist()
        for lo in range(0, len(rows), 1024):
            yield from texts.get(rows[lo:lo + 1024])
        texts.close()  # one partition mapped at a time


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
