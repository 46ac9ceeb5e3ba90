"""Reading raw documents from per-domain sources: directories or globs of .jsonl, .json,
.parquet, .txt (one document per file) and .tar (one document per .txt member).

Readers never raise on bad content: every problem becomes a `Record` with a reject reason and
its location, so the caller decides whether to count it or (``--strict``) stop on it.
"""

from __future__ import annotations

import glob
import json
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".tar")
_DOMAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TAR_BLOCK = 512
_PARQUET_BATCH = 1024


class InputError(Exception):
    """Bad input in ``--strict`` mode, or a source that names no file."""


@dataclass(frozen=True)
class Record:
    """One document as read, or one problem found where a document should have been.

    ``text`` is None exactly when ``problem`` is set. ``line`` is 1-based (the JSON line,
    the array item, the parquet row or the tar member); None for whole files.
    """

    domain: str
    source_id: str
    path: str
    line: int | None
    text: str | None
    problem: str | None = None
    detail: str = ""

    @property
    def location(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"


@dataclass(frozen=True)
class DomainSource:
    """``--domain NAME=PATH``: PATH is a directory (read recursively) or a glob."""

    domain: str
    pattern: str

    @classmethod
    def parse(cls, spec: str) -> DomainSource:
        name, sep, pattern = spec.partition("=")
        if not sep or not pattern:
            raise ValueError(f"--domain expects NAME=PATH, got {spec!r}")
        if not _DOMAIN_NAME.fullmatch(name):
            raise ValueError(f"domain name {name!r} must match {_DOMAIN_NAME.pattern}")
        return cls(name, pattern)

    def files(self) -> list[tuple[Path, str]]:
        """(path, name relative to the source) for every file, sorted by that name."""
        root = Path(self.pattern)
        if root.is_dir():
            found = [(p, p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file()]
        else:
            found = [(Path(p), p) for p in glob.glob(self.pattern, recursive=True)
                     if Path(p).is_file()]
        if not found:
            raise InputError(f"--domain {self.domain}={self.pattern}: no files found")
        return sorted(found, key=lambda item: item[1])


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    # Files and tar members larger than this are rejected unread (the document filter would
    # reject them anyway), so a 50 MB document costs a stat, not a read.
    max_bytes: int = 2_000_000
    cache_dir: str | None = None


def read_domain(source: DomainSource, opts: ReadOptions) -> Iterator[Record]:
    yield from read_files(source.domain, source.files(), opts)


def read_files(domain: str, files: Iterable[tuple[Path, str]], opts: ReadOptions
               ) -> Iterator[Record]:
    for path, name in files:
        yield from _read_file(domain, Path(path), name, opts)


def _read_file(domain: str, path: Path, name: str, opts: ReadOptions) -> Iterator[Record]:
    def problem(reason: str, detail: str, line: int | None = None) -> Record:
        return Record(domain, name if line is None else f"{name}:{line}", str(path), line,
                      None, reason, detail)

    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        yield problem("unsupported_file", f"suffix {suffix or '(none)'} is not one of "
                                          f"{', '.join(SUPPORTED_SUFFIXES)}")
        return
    try:
        size = path.stat().st_size
        if size == 0:
            yield problem("empty_file", "0 bytes")
        elif suffix == ".txt":
            yield _read_txt(domain, path, name, size, opts)
        elif suffix == ".jsonl":
            with open(path, "rb") as f:
                yield from _json_lines(domain, path, name, f, opts.text_field)
        elif suffix == ".json":
            yield from _read_json(domain, path, name, opts.text_field)
        elif suffix == ".parquet":
            yield from _read_parquet(domain, path, name, opts)
        else:
            yield from _read_tar(domain, path, name, opts)
    except OSError as exc:
        yield problem("unreadable_file", f"{type(exc).__name__}: {exc}")


def _decode(data: bytes) -> tuple[str | None, int, str]:
    """(text, 0, "") or (None, 1-based line of the first bad byte, what went wrong)."""
    try:
        return data.decode("utf-8"), 0, ""
    except UnicodeDecodeError as exc:
        return None, data.count(b"\n", 0, exc.start) + 1, f"invalid UTF-8 at byte {exc.start}"


def _read_txt(domain: str, path: Path, name: str, size: int, opts: ReadOptions) -> Record:
    if size > opts.max_bytes:
        return Record(domain, name, str(path), None, None, "too_long",
                      f"{size} bytes > max {opts.max_bytes}")
    text, line, detail = _decode(path.read_bytes())
    if text is None:
        return Record(domain, name, str(path), line, None, "invalid_utf8", detail)
    return Record(domain, name, str(path), None, text)


def _from_value(domain: str, path: Path, source_id: str, line: int, value: object,
                text_field: str) -> Record:
    if isinstance(value, dict):
        value = value.get(text_field)
    if not isinstance(value, str):
        return Record(domain, source_id, str(path), line, None, "missing_text",
                      f"no string field {text_field!r}")
    if not value.isascii():
        try:  # JSON's \ud800-style escapes decode to lone surrogates, which are no text
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return Record(domain, source_id, str(path), line, None, "invalid_utf8",
                          f"unpaired surrogate {value[exc.start]!r} at character {exc.start} "
                          "(a JSON escape)")
    return Record(domain, source_id, str(path), line, value)


def _json_lines(domain: str, path: Path, name: str, lines, text_field: str) -> Iterator[Record]:
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue  # blank separator lines hold no document
        source_id = f"{name}:{number}"
        if isinstance(raw, bytes):
            text, _, detail = _decode(raw)
            if text is None:
                yield Record(domain, source_id, str(path), number, None, "invalid_utf8", detail)
                continue
            raw = text
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            yield Record(domain, source_id, str(path), number, None, "malformed_json",
                         f"{exc.msg} at column {exc.colno}")
            continue
        yield _from_value(domain, path, source_id, number, value, text_field)


def _read_json(domain: str, path: Path, name: str, text_field: str) -> Iterator[Record]:
    """A JSON array of records (or strings), or JSON lines in a .json file."""
    text, line, detail = _decode(path.read_bytes())
    if text is None:
        yield Record(domain, name, str(path), line, None, "invalid_utf8", detail)
        return
    if not text.lstrip().startswith("["):
        yield from _json_lines(domain, path, name, text.splitlines(), text_field)
        return
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        yield Record(domain, f"{name}:{exc.lineno}", str(path), exc.lineno, None,
                     "malformed_json", f"{exc.msg} at column {exc.colno}")
        return
    for number, value in enumerate(items, start=1):
        yield _from_value(domain, path, f"{name}:{number}", number, value, text_field)


def _read_parquet(domain: str, path: Path, name: str, opts: ReadOptions) -> Iterator[Record]:
    # Imported here: `datasets` costs about a second to import and only parquet needs it.
    import datasets
    import pyarrow
    import pyarrow.parquet

    # The footer first: `datasets` logs a broken file's error and its internal schema to
    # stderr before raising, and reports a missing column as an Arrow error.
    try:
        columns = pyarrow.parquet.read_schema(path).names
    except (pyarrow.ArrowException, OSError) as exc:
        yield Record(domain, name, str(path), None, None, "unreadable_file",
                     f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        return
    if opts.text_field not in columns:
        yield Record(domain, name, str(path), None, None, "missing_text",
                     f"no column {opts.text_field!r} (columns: {', '.join(columns)})")
        return
    row = 0
    try:
        stream = datasets.IterableDataset.from_parquet(
            str(path), columns=[opts.text_field], cache_dir=opts.cache_dir)
        for batch in stream.iter(batch_size=_PARQUET_BATCH):
            for value in batch[opts.text_field]:
                row += 1
                yield _from_value(domain, path, f"{name}:{row}", row, value, opts.text_field)
    except (pyarrow.ArrowException, ValueError) as exc:
        yield Record(domain, f"{name}:{row + 1}" if row else name, str(path),
                     row + 1 if row else None, None, "unreadable_file",
                     f"{type(exc).__name__}: {str(exc).splitlines()[0]}")


def _read_tar(domain: str, path: Path, name: str, opts: ReadOptions) -> Iterator[Record]:
    position = 1  # the member being read: its header, then its data
    opened = False
    try:
        with tarfile.open(path, mode="r:") as tar:
            opened = True
            for member in tar:
                yield _read_member(domain, path, name, tar, member, position, opts)
                position += 1
            end = tar.offset
    except tarfile.ReadError as exc:
        yield Record(domain, f"{name}:{position}", str(path), position, None,
                     "truncated_tar" if opened else "unreadable_file",
                     f"at member {position}: {exc}")
        return
    # tarfile stops quietly at end of file, so a tar cut between two members reads as
    # complete; a finished archive ends with two zero blocks.
    with open(path, "rb") as f:
        f.seek(end)
        trailer = f.read(2 * _TAR_BLOCK)
    if len(trailer) < 2 * _TAR_BLOCK or trailer.strip(b"\0"):
        yield Record(domain, f"{name}:{position}", str(path), position, None,
                     "truncated_tar", f"no end-of-archive marker after member {position - 1}")


def _read_member(domain: str, path: Path, name: str, tar: tarfile.TarFile,
                 member: tarfile.TarInfo, number: int, opts: ReadOptions) -> Record:
    source_id = f"{name}/{member.name}"

    def problem(reason: str, detail: str) -> Record:
        return Record(domain, source_id, str(path), number, None, reason, detail)

    if not member.isfile():
        return problem("unsupported_file", f"tar member {member.name!r} is not a regular file")
    if not member.name.endswith(".txt"):
        return problem("unsupported_file", f"tar member {member.name!r} is not .txt")
    if member.size == 0:
        return problem("empty_file", f"tar member {member.name!r} has 0 bytes")
    if member.size > opts.max_bytes:
        return problem("too_long", f"{member.size} bytes > max {opts.max_bytes}")
    data = tar.extractfile(member)
    if data is None:
        return problem("unreadable_file", f"tar member {member.name!r} has no data")
    text, line, detail = _decode(data.read())
    if text is None:
        return problem("invalid_utf8", f"{member.name!r} line {line}: {detail}")
    return Record(domain, source_id, str(path), number, text)
