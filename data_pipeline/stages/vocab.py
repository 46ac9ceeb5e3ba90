"""Stage 7, one task: the tokenizer. ``--tokenizer FILE`` is copied; ``--vocab-size N`` trains a
byte-level BPE on the kept texts, streamed partition by partition in keep order (the trainer
holds word counts, not texts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from data_pipeline.manifest import TOKENIZER_FILE
from data_pipeline.sources import InputError
from data_pipeline.stages.clusters import kept_rows
from data_pipeline.stages.common import Plan, Texts, partition_rows, read_json, task_dir
from data_pipeline.stats import summary_table
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer


def tasks(plan: Plan) -> int:
    return 1


def _kept_texts(work: Path, plan: Plan) -> Iterator[str]:
    starts = partition_rows(work, plan)
    texts = Texts(work, starts)
    for p in range(len(plan.partitions)):
        rows = (kept_rows(work, plan, p, starts) + starts[p]).tolist()
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
