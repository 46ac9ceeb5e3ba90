"""The first stages of ``prepare``: read every source, normalize, filter, count.

Input errors (undecodable bytes, broken JSON, truncated or unreadable files) stop a ``--strict``
run at the first one, naming its file and line; otherwise they are counted and sampled like
filter rejections. Filter decisions (empty, too short, too long) are never errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from data_pipeline.normalize import FilterConfig, NormalizeConfig, normalize, rejection
from data_pipeline.sources import DomainSource, InputError, ReadOptions, Record, read_domain
from data_pipeline.stats import DomainCounts, RejectLog

INPUT_ERRORS = frozenset({
    "invalid_utf8", "malformed_json", "missing_text", "empty_file", "truncated_tar",
    "unreadable_file", "unsupported_file",
})


@dataclass(frozen=True)
class IngestConfig:
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    text_field: str = "text"
    strict: bool = False


def ingest(sources: Sequence[DomainSource], cfg: IngestConfig, counts: dict[str, DomainCounts],
           rejects: RejectLog, cache_dir: str | None = None) -> Iterator[tuple[Record, str]]:
    """Accepted records with their normalized text, domains in name order (the keep rule's
    order), files in name order within a domain."""
    opts = ReadOptions(cfg.text_field, cfg.filters.max_bytes, cache_dir)
    for source in sorted(sources, key=lambda s: s.domain):
        domain = counts.setdefault(source.domain, DomainCounts())
        yield from accept(read_domain(source, opts), cfg, domain, rejects)


def accept(records: Iterable[Record], cfg: IngestConfig, domain: DomainCounts,
           rejects: RejectLog) -> Iterator[tuple[Record, str]]:
    """Normalize and filter records of one domain, counting and sampling what is dropped."""
    for record in records:
        domain.records_in += 1
        if record.problem is not None:
            if cfg.strict and record.problem in INPUT_ERRORS:
                raise InputError(f"{record.location}: {record.problem}: {record.detail}")
            domain.reject(record.problem)
            rejects.add(record.domain, record.source_id, record.location, record.problem,
                        record.detail, None)
            continue
        assert record.text is not None  # Record guarantees text exactly when no problem
        text = normalize(record.text, cfg.normalize)
        reason = rejection(text, cfg.filters)
        if reason is not None:
            domain.reject(reason)
            rejects.add(record.domain, record.source_id, record.location, reason,
                        f"{len(text)} characters after normalization", text)
            continue
        yield record, text
