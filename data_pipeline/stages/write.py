"""Stage 8, one task per partition: tokenize the kept documents, write this partition's
WebDataset shards and its rows of the dedup report. Document keys continue from the kept
documents of the earlier partitions, so the assembled dataset numbers its documents 0, 1, 2, ...
in keep order."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from data_pipeline.manifest import TOKENIZER_FILE
from data_pipeline.shards import ShardSink
from data_pipeline.stages import clusters, exact
from data_pipeline.stages.common import (
    Plan,
    Texts,
    partition_rows,
    read_json,
    task_dir,
    write_json,
)
from data_pipeline.tokenizer import load_tokenizer

_TOKENIZE_BATCH = 256


def tasks(plan: Plan) -> int:
    return len(plan.partitions)


class _Ids:
    """Source ids by global row (one partition's list loaded at a time)."""

    def __init__(self, work: Path, starts: np.ndarray) -> None:
        self.work, self.starts = work, starts
        self._part, self._ids = -1, []

    def __call__(self, row: int) -> tuple[str, str]:
        p = int(np.searchsorted(self.starts, row, side="right") - 1)
        if p != self._part:
            self._part, self._ids = p, read_json(task_dir(self.work, "read", p) / "ids.json")
        return self._ids[row - int(self.starts[p])], str(p)


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    starts = partition_rows(work, plan)
    domain = plan.partitions[index].domain
    domain_id = plan.domains.index(domain)
    keep = read_json(task_dir(work, "clusters", 0) / "keep.json")
    first_key = int(sum(keep["kept"][:index]))
    lo, hi = int(starts[index]), int(starts[index + 1])
    # Loaded once: the kept rows and the report both need them.
    dups = exact.duplicates_in(work, plan, lo, hi)
    near = np.load(task_dir(work, "clusters", 0) / "near.npy")
    rows = (clusters.kept_rows(lo, hi, dups, near) + lo).tolist()
    tokenizer = load_tokenizer(task_dir(work, "vocab", 0) / TOKENIZER_FILE)
    ids = read_json(task_dir(work, "read", index) / "ids.json")
    sink = ShardSink(out, plan.shard_max_docs, plan.shard_max_bytes, first_key=first_key)
    tokens = 0
    with Texts(work, starts, max_open=1) as texts:  # this partition's own texts
        for first in range(0, len(rows), _TOKENIZE_BATCH):
            batch = rows[first:first + _TOKENIZE_BATCH]
            for row, encoding in zip(batch, tokenizer.encode_batch(texts.get(batch)),
                                     strict=True):
                doc = np.asarray(encoding.ids, dtype=np.int64)
                tokens += len(doc)
                sink.write(doc, domain_id, domain, ids[row - int(starts[index])])
    write_json(out / "shards.json", [asdict(s) for s in sink.close()])
    write_json(out / "written.json", {"documents": len(rows), "tokens": tokens})
    _report(plan, work, starts, lo, hi, dups, near, out)


def _report(plan: Plan, work: Path, starts: np.ndarray, lo: int, hi: int, dups: np.ndarray,
            near: np.ndarray, out: Path) -> None:
    """dedup_report rows of the documents this partition lost: exact, then near."""
    source = _Ids(work, starts)
    domain_of = {str(p): part.domain for p, part in enumerate(plan.partitions)}

    def who(row: int) -> tuple[str, str]:
        source_id, p = source(row)
        return source_id, domain_of[p]

    with open(out / "report_exact.jsonl", "w", encoding="utf-8") as f:
        for row, first in dups.tolist():
            (removed, removed_domain), (kept, kept_domain) = who(row), who(first)
            f.write(json.dumps({"stage": "exact", "removed": removed,
                                "removed_domain": removed_domain, "kept": kept,
                                "kept_domain": kept_domain, "jaccard": 1.0},
                               ensure_ascii=False) + "\n")
    a, b = np.searchsorted(near["row"], [lo, hi])
    with open(out / "report_near.jsonl", "w", encoding="utf-8") as f:
        for row, kept_row, jaccard, partner, partner_j in near[a:b].tolist():
            (removed, removed_domain), (kept, kept_domain) = who(row), who(kept_row)
            f.write(json.dumps({"stage": "near", "removed": removed,
                                "removed_domain": removed_domain, "kept": kept,
                                "kept_domain": kept_domain, "jaccard": round(jaccard, 4),
                                "matched": who(partner)[0],
                                "matched_jaccard": round(partner_j, 4),
                                "verified_by": plan.minhash.verify},
                               ensure_ascii=False) + "\n")
