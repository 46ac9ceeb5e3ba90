"""Stage 9, one task: assemble the dataset from the task outputs.

Shards are hard-linked (no copy) under their dataset-wide names, each domain's Megatron
partitions are concatenated by megatron-core's ``IndexedDatasetBuilder.add_index``, the report
pieces and reject samples are merged in keep order, and ``manifest.json`` is written. The
runner renames this task's directory to ``--output``.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.manifest import (
    TOKEN_DTYPE,
    TOKENIZER_FILE,
    file_sha256,
    load_index,
    write_manifest,
)
from data_pipeline.shards import SHARD_PATTERN, index_name
from data_pipeline.stages.common import Plan, read_json, task_dir
from data_pipeline.stats import DomainCounts
from data_pipeline.tokenizer import eod_id, load_tokenizer

REJECTS_FILE = "rejects.jsonl"
DEDUP_REPORT = "dedup_report.jsonl"
MEGATRON_DIR = "megatron"


def tasks(plan: Plan) -> int:
    return 1


def counts_of(work: Path, plan: Plan, written: bool = True) -> dict[str, DomainCounts]:
    """Per-domain counts from the task outputs (``written``: the write stage has run)."""
    counts = {d: DomainCounts() for d in plan.domains}
    keep = read_json(task_dir(work, "clusters", 0) / "keep.json")
    for p, part in enumerate(plan.partitions):
        c, read = counts[part.domain], read_json(task_dir(work, "read", p) / "counts.json")
        c.records_in += read["records_in"]
        for reason, n in read["rejected"].items():
            c.rejected[reason] = c.rejected.get(reason, 0) + n
        c.exact_duplicates += keep["exact_duplicates"][p]
        c.near_duplicates += keep["near_duplicates"][p]
        if written:
            done = read_json(task_dir(work, "write", p) / "written.json")
            c.kept += done["documents"]
            c.tokens += done["tokens"]
    return counts


def _rejects(work: Path, plan: Plan) -> list[dict[str, Any]]:
    """The first samples per reason over all partitions, in keep order."""
    seen: dict[str, int] = {}
    out = []
    for p in range(len(plan.partitions)):
        for sample in read_json(task_dir(work, "read", p) / "rejects.json"):
            n = seen.get(sample["reason"], 0)
            seen[sample["reason"]] = n + 1
            if n < plan.reject_samples:
                out.append(sample)
    return out


def _concat(paths: list[Path], target: Path) -> None:
    with open(target, "wb") as f:
        for path in paths:
            f.write(path.read_bytes())


def _megatron(plan: Plan, out: Path, shards: list[dict[str, Any]], vocab_size: int
              ) -> dict[str, Any]:
    """One prefix per domain, written by megatron-core's ``IndexedDatasetBuilder``: every
    kept document of the domain, in keep order, as one sequence and one document. Read from
    the assembled shards through their indexes (megatron-core is imported by this task only:
    it brings torch)."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    (out / MEGATRON_DIR).mkdir()
    dtype = DType.optimal_dtype(vocab_size)
    builders = {d: IndexedDatasetBuilder(str(out / MEGATRON_DIR / f"{d}.bin"), dtype=dtype)
                for d in plan.domains}
    for shard in shards:
        index = load_index(out, shard)
        with open(out / shard["tar"], "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for offset, n, domain in index.tolist():
                raw = data[offset:offset + n * TOKEN_DTYPE.itemsize]  # a copy: the map can close
                tokens = np.frombuffer(raw, dtype=TOKEN_DTYPE)
                builders[plan.domains[domain]].add_document(tokens, [n])
    entries = {}
    for domain, builder in builders.items():
        prefix = out / MEGATRON_DIR / domain
        builder.finalize(f"{prefix}.idx")
        entries[domain] = {ext: {"file": f"{MEGATRON_DIR}/{domain}.{ext}",
                                 "sha256": file_sha256(Path(f"{prefix}.{ext}"))}
                           for ext in ("bin", "idx")}
    return entries


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    shards = []
    for p in range(len(plan.partitions)):
        root = task_dir(work, "write", p)
        for shard in read_json(root / "shards.json"):
            name = SHARD_PATTERN % len(shards)
            os.link(root / shard["tar"], out / name)
            os.link(root / shard["index"], out / index_name(name))
            shards.append({**shard, "tar": name, "index": index_name(name)})
    tokenizer_path = task_dir(work, "vocab", 0) / TOKENIZER_FILE
    os.link(tokenizer_path, out / TOKENIZER_FILE)
    tokenizer = load_tokenizer(tokenizer_path)
    _concat([task_dir(work, "write", p) / f"report_{stage}.jsonl"
             for stage in ("exact", "near") for p in range(len(plan.partitions))],
            out / DEDUP_REPORT)
    with open(out / REJECTS_FILE, "w", encoding="utf-8") as f:

        for sample in _rejects(work, plan):
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    counts = counts_of(work, plan)
    domains = list(plan.domains)
    record = plan.record()
    manifest = {
        "domains": domains,
        "sources": plan.sources,
        "counts": {d: counts[d].as_dict() for d in domains},
        "tokenizer": {"file": TOKENIZER_FILE, "sha256": file_sha256(out / TOKENIZER_FILE),
                      "vocab_size": tokenizer.get_vocab_size(), "eod_id": eod_id(tokenizer)},
        "shards": shards,
        "config": {k: record[k] for k in ("ingest", "minhash", "near_dedup", "shard_max_docs",
                                          "shard_max_bytes", "partition_bytes",
                                          "vocab_sample_bytes", "output_format")},
    }
    if plan.output_format == "megatron":
        manifest["megatron"] = _megatron(plan, out, shards, tokenizer.get_vocab_size())
    write_manifest(out, manifest)
