"""``python -m data_pipeline prepare``: sources -> normalized, filtered, deduplicated, tokenized
WebDataset shards with per-shard indexes (and Megatron ``.bin``/``.idx`` with
``--output-format megatron``), ``manifest.json``, ``rejects.jsonl`` and ``dedup_report.jsonl``.

The work is a fixed list of stages over partitions (``stages/``), run by an executor
(``executors/``). The plan (partitions and task counts) depends on the inputs and flags only,
never on the executor or the number of workers, so the output is byte for byte the same for
any of them. Everything happens in ``.OUTPUT.work/`` beside the output; a run killed at any
point, re-run with the same arguments, resumes at the first unfinished task; the finished
dataset is renamed into place, so a failed run leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from data_pipeline.executors.local import LocalExecutor
from data_pipeline.ingest import IngestConfig
from data_pipeline.manifest import load_manifest
from data_pipeline.minhash import MinHashConfig
from data_pipeline.sources import DomainSource, InputError
from data_pipeline.stages import STAGES, finalize
from data_pipeline.stages.common import PLAN, Partition, Plan, read_json, task_dir, write_json
from data_pipeline.stats import DomainCounts, summary_table
from data_pipeline.tokenizer import eod_id, load_tokenizer

REJECTS_FILE = finalize.REJECTS_FILE
DEDUP_REPORT = finalize.DEDUP_REPORT
OUTPUT_FORMATS = ("webdataset", "megatron")


class Executor(Protocol):
    def run(self, work: Path, stages: list[tuple[str, int]]) -> None: ...


@dataclass(frozen=True)
class PrepareConfig:
    sources: tuple[DomainSource, ...]
    output: Path
    tokenizer: Path | None = None
    vocab_size: int | None = None
    # BPE trains on about this many bytes of text (0: all kept text), so the one `vocab`
    # task's time and memory stop growing with the corpus; see stages/vocab.py.
    vocab_sample_bytes: int = 256 << 20
    ingest: IngestConfig = field(default_factory=IngestConfig)
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    near_dedup: bool = True
    shard_max_docs: int = 10_000
    shard_max_bytes: int = 256 << 20
    reject_samples: int = 20
    # Input files are grouped, in keep order and never across domains, into partitions of
    # about this many bytes; one task reads one partition. Part of the output's identity.
    partition_bytes: int = 64 << 20
    output_format: str = "webdataset"  # "megatron": Megatron .bin/.idx as well
    progress: bool | None = None  # kept for callers; stages print no progress bars

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("at least one --domain is required")
        if (self.tokenizer is None) == (self.vocab_size is None):
            raise ValueError("give exactly one of --tokenizer FILE and --vocab-size N")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise ValueError(f"--tokenizer {self.tokenizer}: no such file")
        if self.tokenizer is not None:  # a bad file fails here, not in a stage's worker
            try:
                eod_id(load_tokenizer(self.tokenizer))
            except ValueError as exc:
                raise ValueError(f"--tokenizer {self.tokenizer}: {exc}") from None
        if self.vocab_sample_bytes < 0:
            raise ValueError(f"--vocab-sample-bytes must be >= 0, got {self.vocab_sample_bytes}")
        if self.reject_samples < 0:
            raise ValueError(f"reject_samples must be >= 0, got {self.reject_samples}")
        if self.partition_bytes < 1:
            raise ValueError(f"--partition-bytes must be >= 1, got {self.partition_bytes}")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"--output-format must be one of {OUTPUT_FORMATS}")
        if self.shard_max_docs < 1 or self.shard_max_bytes < 1:
            raise ValueError(f"shard limits must be >= 1, got {self.shard_max_docs} docs, "
                             f"{self.shard_max_bytes} bytes")


@dataclass(frozen=True)
class PrepareResult:
    output: Path
    manifest: dict[str, Any]
    counts: dict[str, DomainCounts]

    def summary(self) -> str:
        return summary_table(self.counts)


def partitions(sources: tuple[DomainSource, ...], target_bytes: int) -> list[Partition]:
    """Consecutive files of each domain (domains by name, files by name: keep order), cut
    when a group reaches ``target_bytes``. A file is never split."""
    by_domain: dict[str, list[tuple[str, str]]] = {}
    for source in sorted(sources, key=lambda s: s.domain):
        by_domain.setdefault(source.domain, []).extend(
            (str(path), name) for path, name in source.files())
    out = []
    for domain, files in by_domain.items():
        group: list[tuple[str, str]] = []
        size = 0
        for path, name in files:
            group.append((path, name))
            size += Path(path).stat().st_size
            if size >= target_bytes:
                out.append(Partition(domain, tuple(group)))
                group, size = [], 0
        if group:
            out.append(Partition(domain, tuple(group)))
    return out


def make_plan(cfg: PrepareConfig) -> Plan:
    parts = partitions(cfg.sources, cfg.partition_bytes)
    domains = sorted({s.domain for s in cfg.sources})
    # Shuffle stages get as many tasks as there are partitions: each then holds about one
    # partition's share of the hashes, band keys or pairs.
    shuffle = max(1, len(parts))
    return Plan(
        partitions=tuple(parts), domains=tuple(domains),
        sources={d: [s.pattern for s in cfg.sources if s.domain == d] for d in domains},
        ingest=cfg.ingest, minhash=cfg.minhash, near_dedup=cfg.near_dedup,
        tokenizer=None if cfg.tokenizer is None else str(Path(cfg.tokenizer).resolve()),
        vocab_size=cfg.vocab_size, vocab_sample_bytes=cfg.vocab_sample_bytes,
        shard_max_docs=cfg.shard_max_docs,
        shard_max_bytes=cfg.shard_max_bytes, reject_samples=cfg.reject_samples,
        partition_bytes=cfg.partition_bytes, output_format=cfg.output_format,
        exact_tasks=shuffle, bucket_tasks=shuffle, verify_tasks=shuffle)


def stage_tasks(plan: Plan) -> list[tuple[str, int]]:
    import importlib

    return [(s, importlib.import_module(f"data_pipeline.stages.{s}").tasks(plan))
            for s in STAGES]


def work_dir(output: Path) -> Path:
    return output.parent / f".{output.name}.work"


def _open_work(work: Path, plan: Plan) -> None:
    """Reuse the work of an earlier run with the same plan; start afresh otherwise."""
    record = plan.record()
    if work.is_dir():
        try:
            if read_json(work / PLAN) == json.loads(json.dumps(record)):
                return
        except (OSError, ValueError):
            pass
        shutil.rmtree(work)
    work.mkdir(parents=True)
    write_json(work / PLAN, record)


def prepare(cfg: PrepareConfig, executor: Executor | None = None) -> PrepareResult:
    """Run (or resume) every stage with ``executor`` (default: the local pool, 1 worker)."""
    output = Path(cfg.output).absolute()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise InputError(f"--output {output} already exists and is not empty")
    plan = make_plan(cfg)
    work = work_dir(output)
    lock_path = output.parent / f".{output.name}.lock"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "w")
    except OSError as exc:
        raise InputError(f"--output {output}: cannot write there ({exc.strerror})") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another prepare is writing {output}") from None
        try:
            _open_work(work, plan)
            try:
                (executor or LocalExecutor(1)).run(work, stage_tasks(plan))
            except (InputError, ValueError):
                shutil.rmtree(work, ignore_errors=True)  # bad input: nothing worth resuming
                raise
            if output.exists():
                output.rmdir()  # empty, checked above
            task_dir(work, "finalize", 0).rename(output)
            shutil.rmtree(work)
        finally:
            lock_path.unlink(missing_ok=True)  # still ours: removed before the lock is let go
    manifest = load_manifest(output)
    counts = {d: DomainCounts(**{**c, "rejected": dict(c["rejected"])})
              for d, c in manifest["counts"].items()}
    return PrepareResult(output, manifest, counts)
