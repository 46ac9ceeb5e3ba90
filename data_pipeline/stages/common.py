"""What every stage shares: the plan (``plan.json``: the configuration and the partitions, fixed
before any task runs), the work directory's layout, global row numbering, and the completion
marker that makes a task's output trustworthy.

A task writes into a fresh temporary directory, which is renamed to ``STAGE/NNNNN/`` when the
task returns; then ``STAGE/NNNNN.done`` is written (atomically) with the sha256 of every output
file. A task is complete exactly when its marker parses and every file it names is there with
that hash, so a task killed at any point, or an output damaged afterwards, is redone, never read.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.ingest import IngestConfig
from data_pipeline.manifest import file_sha256
from data_pipeline.minhash import MinHashConfig
from data_pipeline.normalize import FilterConfig, NormalizeConfig
from data_pipeline.shingle_text import ShingleNormalization

PLAN = "plan.json"
# Keep-order row numbers of a partition start at the sum of the earlier partitions' counts.
DIGEST_BYTES = 16


@dataclass(frozen=True)
class Partition:
    """Consecutive files of one domain (in keep order), read by one task."""

    domain: str
    files: tuple[tuple[str, str], ...]  # (path, name relative to its source)


@dataclass(frozen=True)
class Plan:
    """Everything a task needs, as written to ``plan.json``."""

    partitions: tuple[Partition, ...]
    domains: tuple[str, ...]
    sources: dict[str, list[str]]
    ingest: IngestConfig
    minhash: MinHashConfig
    near_dedup: bool
    tokenizer: str | None
    vocab_size: int | None
    vocab_sample_bytes: int
    shard_max_docs: int
    shard_max_bytes: int
    reject_samples: int
    partition_bytes: int
    output_format: str
    exact_tasks: int
    bucket_tasks: int
    verify_tasks: int

    def record(self) -> dict[str, Any]:
        return {
            "partitions": [{"domain": p.domain, "files": [list(f) for f in p.files]}
                           for p in self.partitions],
            "domains": list(self.domains), "sources": self.sources,
            "ingest": {"normalize": vars(self.ingest.normalize),
                       "filters": vars(self.ingest.filters),
                       "text_field": self.ingest.text_field, "strict": self.ingest.strict},
            "minhash": {**{k: v for k, v in vars(self.minhash).items() if k != "shingle"},
                        "shingle": vars(self.minhash.shingle)},
            "near_dedup": self.near_dedup, "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size, "vocab_sample_bytes": self.vocab_sample_bytes,
            "shard_max_docs": self.shard_max_docs,
            "shard_max_bytes": self.shard_max_bytes, "reject_samples": self.reject_samples,
            "partition_bytes": self.partition_bytes, "output_format": self.output_format,
            "exact_tasks": self.exact_tasks, "bucket_tasks": self.bucket_tasks,
            "verify_tasks": self.verify_tasks,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Plan:
        ing = r["ingest"]
        mh = dict(r["minhash"])
        mh["shingle"] = ShingleNormalization(**mh["shingle"])
        return cls(
            partitions=tuple(Partition(p["domain"], tuple(tuple(f) for f in p["files"]))
                             for p in r["partitions"]),
            domains=tuple(r["domains"]), sources=r["sources"],
            ingest=IngestConfig(NormalizeConfig(**ing["normalize"]),
                                FilterConfig(**ing["filters"]), ing["text_field"],
                                ing["strict"]),
            minhash=MinHashConfig(**mh), near_dedup=r["near_dedup"], tokenizer=r["tokenizer"],
            vocab_size=r["vocab_size"], vocab_sample_bytes=r["vocab_sample_bytes"],
            shard_max_docs=r["shard_max_docs"],
            shard_max_bytes=r["shard_max_bytes"], reject_samples=r["reject_samples"],
            partition_bytes=r["partition_bytes"], output_format=r["output_format"],
            exact_tasks=r["exact_tasks"], bucket_tasks=r["bucket_tasks"],
            verify_tasks=r["verify_tasks"])


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, sort_keys=True, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_plan(work: Path) -> Plan:
    return Plan.from_record(read_json(work / PLAN))


def task_dir(work: Path, stage: str, index: int) -> Path:
    return work / stage / f"{index:05d}"


def _marker(work: Path, stage: str, index: int) -> Path:
    return work / stage / f"{index:05d}.done"


def is_complete(work: Path, stage: str, index: int) -> bool:
    """The marker is there and every output it names has its recorded hash."""
    try:
        outputs = read_json(_marker(work, stage, index))["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    root = task_dir(work, stage, index)
    present = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) \
        if root.is_dir() else []
    if present != sorted(outputs):
        return False
    return all(file_sha256(root / name) == digest for name, digest in outputs.items())


def begin(work: Path, stage: str, index: int) -> Path:
    """A fresh, empty directory for a task's outputs (a stale one from a killed try is
    removed), and no marker."""
    _marker(work, stage, index).unlink(missing_ok=True)
    tmp = work / stage / f"{index:05d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(work: Path, stage: str, index: int, tmp: Path) -> None:
    final = task_dir(work, stage, index)
    shutil.rmtree(final, ignore_errors=True)
    outputs = {p.relative_to(tmp).as_posix(): file_sha256(p)
               for p in sorted(tmp.rglob("*")) if p.is_file()}
    os.rename(tmp, final)
    write_json(_marker(work, stage, index), {"outputs": outputs})


def partition_rows(work: Path, plan: Plan) -> np.ndarray:
    """Start row of every partition plus the total (read stage's document counts)."""
    counts = [read_json(task_dir(work, "read", p) / "counts.json")["documents"]
              for p in range(len(plan.partitions))]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def mix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: spreads keys evenly over tasks."""
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


class Texts:
    """Random access to the accepted texts of every partition by global row.

    Read with ``pread``, not memory-mapped: a mapping adds the kernel's fault-around pages
    (64 KiB per touch) to the task's RSS, so a task reading documents scattered over the corpus
    (``verify``) would look as large as every page it brushed. At most ``max_open`` partitions
    are open at once (least recently used closed first), so a corpus of many thousands of
    partitions needs neither as many file descriptors nor all their offsets in memory."""

    def __init__(self, work: Path, starts: np.ndarray, max_open: int = 64) -> None:
        self.work = work
        self.starts = starts
        self.max_open = max_open
        self._open: OrderedDict[int, tuple[np.ndarray, int]] = OrderedDict()

    def _partition(self, p: int) -> tuple[np.ndarray, int]:
        if p in self._open:
            self._open.move_to_end(p)
            return self._open[p]
        if len(self._open) >= self.max_open:
            os.close(self._open.popitem(last=False)[1][1])
        root = task_dir(self.work, "read", p)
        self._open[p] = (np.load(root / "offsets.npy"), os.open(root / "texts.bin", os.O_RDONLY))
        return self._open[p]

    def get(self, rows: list[int]) -> list[str]:
        parts = np.searchsorted(self.starts, rows, side="right") - 1
        out = []
        for row, p in zip(rows, parts.tolist(), strict=True):
            offsets, fd = self._partition(p)
            local = row - int(self.starts[p])
            lo, hi = int(offsets[local]), int(offsets[local + 1])
            out.append(os.pread(fd, hi - lo, lo).decode("utf-8"))
        return out

    def close(self) -> None:
        for _, fd in self._open.values():
            os.close(fd)
        self._open.clear()

    def __enter__(self) -> Texts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
