"""``python -m data_pipeline prepare``: sources -> normalized, filtered, deduplicated, tokenized
WebDataset shards with per-shard indexes, ``manifest.json``, ``rejects.jsonl`` and
``dedup_report.jsonl``.

Sources are read once. Accepted texts are spilled to a staging file while exact duplicates are
dropped on the fly (the first copy in keep order wins) and MinHash signatures are computed in
batches, so memory holds signatures (num_perm x 4 bytes per document), not texts. The output is
assembled in a staging directory and renamed into place, so a failed run leaves nothing that
looks like a dataset.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data_pipeline.dedup import NearDuplicates, near_duplicates
from data_pipeline.ingest import IngestConfig, ingest
from data_pipeline.manifest import file_sha256, write_manifest
from data_pipeline.minhash import MinHashConfig, signatures
from data_pipeline.shards import ShardSink
from data_pipeline.sources import DomainSource, InputError
from data_pipeline.stats import DomainCounts, RejectLog, summary_table
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer

TOKENIZER_FILE = "tokenizer.json"
REJECTS_FILE = "rejects.jsonl"
DEDUP_REPORT = "dedup_report.jsonl"
_SIGNATURE_BATCH_BYTES = 4 << 20
_TOKENIZE_BATCH = 256


@dataclass(frozen=True)
class PrepareConfig:
    sources: tuple[DomainSource, ...]
    output: Path
    tokenizer: Path | None = None
    vocab_size: int | None = None
    ingest: IngestConfig = field(default_factory=IngestConfig)
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    near_dedup: bool = True
    shard_max_docs: int = 10_000
    shard_max_bytes: int = 256 << 20
    reject_samples: int = 20
    progress: bool | None = None  # None: progress bars only on a terminal

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("at least one --domain is required")
        if (self.tokenizer is None) == (self.vocab_size is None):
            raise ValueError("give exactly one of --tokenizer FILE and --vocab-size N")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise ValueError(f"--tokenizer {self.tokenizer}: no such file")
        if self.reject_samples < 0:
            raise ValueError(f"reject_samples must be >= 0, got {self.reject_samples}")


@dataclass(frozen=True)
class PrepareResult:
    output: Path
    manifest: dict[str, Any]
    counts: dict[str, DomainCounts]

    def summary(self) -> str:
        return summary_table(self.counts)


def _bars_off(cfg: PrepareConfig) -> bool | None:
    return None if cfg.progress is None else not cfg.progress


class _Report:
    """dedup_report.jsonl, written as removals are decided (it can be as long as the input)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "w", encoding="utf-8")

    def add(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()


class _Spill:
    """Accepted texts, append-only on disk, read back by position."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")
        self.offsets: list[int] = [0]

    def append(self, text: str) -> None:
        self.offsets.append(self.offsets[-1] + self._file.write(text.encode("utf-8")))

    def texts(self, rows: Sequence[int]) -> Iterator[str]:
        self._file.flush()
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for row in rows:
                yield m[self.offsets[row]:self.offsets[row + 1]].decode("utf-8")

    def close(self) -> None:
        self._file.close()


@dataclass
class _Documents:
    """The accepted, exactly-unique documents in keep order (domain, file, line)."""

    domain: list[str] = field(default_factory=list)
    source_id: list[str] = field(default_factory=list)
    signatures: list[np.ndarray] = field(default_factory=list)


def _read_stage(cfg: PrepareConfig, staging: Path, counts: dict[str, DomainCounts],
                rejects: RejectLog, spill: _Spill, report: _Report) -> _Documents:
    docs = _Documents()
    first_copy: dict[bytes, int] = {}
    pending: list[str] = []
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending_bytes
        if pending:
            docs.signatures.append(signatures(pending, cfg.minhash))
            pending.clear()
            pending_bytes = 0

    records = ingest(cfg.sources, cfg.ingest, counts, rejects, cache_dir=str(staging / "hf"))
    for record, text in tqdm(records, desc="read+normalize+filter", unit="doc",
                             disable=_bars_off(cfg)):
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        row = first_copy.get(digest)
        if row is not None:
            counts[record.domain].exact_duplicates += 1
            report.add({"stage": "exact", "removed": record.source_id,
                           "removed_domain": record.domain, "kept": docs.source_id[row],
                           "kept_domain": docs.domain[row], "jaccard": 1.0})
            continue
        first_copy[digest] = len(docs.source_id)
        docs.domain.append(record.domain)
        docs.source_id.append(record.source_id)
        spill.append(text)
        pending.append(text)
        pending_bytes += len(text)
        if pending_bytes >= _SIGNATURE_BATCH_BYTES:
            flush()
    flush()
    return docs


def _near_dedup_stage(cfg: PrepareConfig, docs: _Documents, spill: _Spill,
                      counts: dict[str, DomainCounts], report: _Report) -> np.ndarray:
    """Rows to keep, in order."""
    n = len(docs.source_id)
    if not cfg.near_dedup or n == 0:
        return np.arange(n)
    sig = np.concatenate(docs.signatures)
    found: NearDuplicates = near_duplicates(sig, cfg.minhash, lambda rows: list(spill.texts(rows)))
    for row in found.removed.tolist():
        kept, partner = int(found.kept[row]), int(found.partner[row])
        counts[docs.domain[row]].near_duplicates += 1
        report.add({"stage": "near", "removed": docs.source_id[row],
                       "removed_domain": docs.domain[row], "kept": docs.source_id[kept],
                       "kept_domain": docs.domain[kept],
                       "jaccard": round(float(found.jaccard_to_kept[row]), 4),
                       "matched": docs.source_id[partner],
                       "matched_jaccard": round(float(found.partner_jaccard[row]), 4),
                       "verified_by": cfg.minhash.verify})
    return np.flatnonzero(found.kept == np.arange(n))


def _tokenizer(cfg: PrepareConfig, spill: _Spill, keep: np.ndarray, staging: Path) -> Tokenizer:
    if cfg.tokenizer is not None:
        tokenizer = load_tokenizer(cfg.tokenizer)
    else:
        assert cfg.vocab_size is not None  # PrepareConfig requires one of the two
        tokenizer = train_bpe_tokenizer(spill.texts(keep.tolist()), cfg.vocab_size)
    eod_id(tokenizer)  # fails early, with a clear message, for a tokenizer without EOD
    tokenizer.save(str(staging / TOKENIZER_FILE))
    return tokenizer


def _write_stage(cfg: PrepareConfig, staging: Path, docs: _Documents, spill: _Spill,
                 keep: np.ndarray, tokenizer: Tokenizer, domains: list[str],
                 counts: dict[str, DomainCounts]) -> list[dict[str, Any]]:
    sink = ShardSink(staging, cfg.shard_max_docs, cfg.shard_max_bytes)
    domain_id = {name: k for k, name in enumerate(domains)}
    rows = keep.tolist()
    texts = spill.texts(rows)
    with tqdm(total=len(rows), desc="tokenize+write", unit="doc",
              disable=_bars_off(cfg)) as bar:
        for lo in range(0, len(rows), _TOKENIZE_BATCH):
            batch = rows[lo:lo + _TOKENIZE_BATCH]
            encodings = tokenizer.encode_batch([next(texts) for _ in batch])
            for row, encoding in zip(batch, encodings, strict=True):
                domain = docs.domain[row]
                counts[domain].kept += 1
                counts[domain].tokens += len(encoding.ids)
                sink.write(np.asarray(encoding.ids, dtype=np.int64), domain_id[domain], domain,
                           docs.source_id[row])
            bar.update(len(batch))
    return [asdict(shard) for shard in sink.close()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _config_record(cfg: PrepareConfig) -> dict[str, Any]:
    return {
        "ingest": asdict(cfg.ingest),
        "minhash": asdict(cfg.minhash),
        "near_dedup": cfg.near_dedup,
        "shard_max_docs": cfg.shard_max_docs,
        "shard_max_bytes": cfg.shard_max_bytes,
    }


def prepare(cfg: PrepareConfig) -> PrepareResult:
    output = Path(cfg.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise InputError(f"--output {output} already exists and is not empty")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    spill = _Spill(staging / "texts.spill")
    report = _Report(staging / DEDUP_REPORT)
    try:
        counts: dict[str, DomainCounts] = {}
        rejects = RejectLog(cfg.reject_samples)
        docs = _read_stage(cfg, staging, counts, rejects, spill, report)
        keep = _near_dedup_stage(cfg, docs, spill, counts, report)
        report.close()
        if len(keep) == 0:
            raise InputError("no document survived filtering and deduplication:\n"
                             + summary_table(counts))
        tokenizer = _tokenizer(cfg, spill, keep, staging)
        domains = sorted(counts)
        shards = _write_stage(cfg, staging, docs, spill, keep, tokenizer, domains, counts)
        spill.close()
        (staging / "texts.spill").unlink()
        shutil.rmtree(staging / "hf", ignore_errors=True)
        _write_jsonl(staging / REJECTS_FILE, rejects.samples)
        manifest = write_manifest(staging, {
            "domains": domains,
            "sources": {d: [s.pattern for s in cfg.sources if s.domain == d] for d in domains},
            "counts": {d: counts[d].as_dict() for d in domains},
            "tokenizer": {"file": TOKENIZER_FILE,
                          "sha256": file_sha256(staging / TOKENIZER_FILE),
                          "vocab_size": tokenizer.get_vocab_size(),
                          "eod_id": eod_id(tokenizer)},
            "shards": shards,
            "config": _config_record(cfg),
        })
        if output.exists():
            output.rmdir()  # empty, checked above
        os.rename(staging, output)
    finally:
        spill.close()
        report.close()
        shutil.rmtree(staging, ignore_errors=True)
    return PrepareResult(output, manifest, counts)
