"""A small generated multi-domain corpus in every supported source format (helpers for the
session fixtures in conftest.py and for tests that build variants of it)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_pipeline.executors.local import LocalExecutor
from data_pipeline.prepare import PrepareConfig, PrepareResult, prepare
from data_pipeline.sources import DomainSource

VOCAB_SIZE = 320


def random_texts(rng: np.random.Generator, n: int, words: tuple[int, int]) -> list[str]:
    vocab = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "po", "ri", "su", "te")
             for b in ("n", "sh", "ta", "vo", "x", "ral", "mek", "dun", "zi", "qua")]
    return [" ".join(rng.choice(vocab, int(rng.integers(*words)))) for _ in range(n)]


def tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True)
class Corpus:
    root: Path
    sources: tuple[DomainSource, ...]
    # (source_id of the removed copy, source_id of the kept original), by construction
    exact_copy: tuple[str, str]
    near_copy: tuple[str, str]
    cross_domain_copy: tuple[str, str]


def write_corpus(root: Path, seed: int = 0) -> Corpus:
    """books: parquet + JSON array; code: .txt files + a tar of .txt; web: two .jsonl files."""
    rng = np.random.default_rng(seed)
    books, code, web = root / "books", root / "code", root / "web"
    for d in (books, code, web):
        d.mkdir(parents=True)
    book_texts = random_texts(rng, 60, (80, 400))
    pq.write_table(pa.table({"text": book_texts[:40], "id": list(range(40))}),
                   books / "part-0.parquet")
    (books / "more.json").write_text(json.dumps([{"text": t} for t in book_texts[40:]]),
                                     encoding="utf-8")
    code_texts = random_texts(rng, 60, (50, 300))
    for k, text in enumerate(code_texts[:40]):
        (code / f"file{k:02d}.txt").write_text(text.replace(" ", "\n", 5), encoding="utf-8")
    (code / "bundle.tar").write_bytes(tar_bytes(
        {f"m{k:02d}.txt": t.encode() for k, t in enumerate(code_texts[40:])}))
    web_texts = random_texts(rng, 120, (100, 300))
    # An exact copy after normalization (trailing spaces and blank CRLF lines), a near copy
    # (two words changed: J ~ 0.92) and a near copy of a code document in another domain.
    exact = web_texts[3] + "   \r\n\r\n\r\n"
    near_words = web_texts[5].split()
    near_words[20], near_words[60] = "changed", "words"
    cross_words = code_texts[7].split()
    cross_words[10] = "edited"
    web_texts += [exact, " ".join(near_words), " ".join(cross_words)]
    for name, part in (("a.jsonl", web_texts[:60]), ("b.jsonl", web_texts[60:])):
        (web / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in part),
                                encoding="utf-8")
    n = len(web_texts)
    return Corpus(
        root, tuple(DomainSource(d.name, str(d)) for d in (web, code, books)),
        exact_copy=(f"b.jsonl:{n - 3 - 60 + 1}", "a.jsonl:4"),
        near_copy=(f"b.jsonl:{n - 2 - 60 + 1}", "a.jsonl:6"),
        cross_domain_copy=(f"b.jsonl:{n - 1 - 60 + 1}", "file07.txt"),
    )


def prepare_corpus(corpus: Corpus, output: Path, executor=None, **kwargs) -> PrepareResult:
    """In this process (``LocalExecutor(0)``) unless an executor is given."""
    if "tokenizer" not in kwargs:
        kwargs.setdefault("vocab_size", VOCAB_SIZE)
    return prepare(PrepareConfig(sources=corpus.sources, output=output,
                                 shard_max_docs=kwargs.pop("shard_max_docs", 64),
                                 progress=False, **kwargs),
                   executor if executor is not None else LocalExecutor(0))


def write_bad_directory(root: Path) -> dict[str, int]:
    """Every kind of bad input, and the counts prepare must report for it."""
    rng = np.random.default_rng(1)
    good = iter(random_texts(rng, 20, (40, 80)))
    root.mkdir()
    (root / "good.jsonl").write_text("".join(json.dumps({"text": next(good)}) + "\n"
                                             for _ in range(3)))
    (root / "broken.jsonl").write_bytes(b"\n".join([
        json.dumps({"text": next(good)}).encode(),
        b'{"text": "unterminated',
        b'{"text": "bad byte \xff here, long enough to pass the filters"}',
        json.dumps({"title": "no text field"}).encode(),
        json.dumps({"text": next(good)}).encode(),
        # Valid JSON whose escape decodes to a lone surrogate, which no UTF-8 text holds.
        b'{"text": "lone surrogate \\ud800 here, long enough to pass the filters"}',
    ]) + b"\n")
    (root / "invalid.txt").write_bytes(next(good).encode() + b"\nline two \xc3\x28\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "empty.jsonl").write_bytes(b"")
    (root / "blank.txt").write_text("   \n\n\t\n")
    (root / "short.txt").write_text("tiny")
    with open(root / "huge.txt", "wb") as f:  # a 50 MB single document
        f.write(b"lorem ipsum dolor sit amet " * (50 * 2**20 // 27 + 1))
    members = {f"doc{k}.txt": next(good).encode() for k in range(3)}
    whole = tar_bytes(members)
    (root / "trunc.tar").write_bytes(whole[:512 + 512 + 600])  # cut inside member 2's data
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        third = tar.getmembers()[2].offset
    (root / "cut.tar").write_bytes(tar_bytes({f"c{k}.txt": next(good).encode()
                                              for k in range(3)})[:third])
    (root / "notes.md").write_text("not a supported format")
    # A parquet file without the text column, and one that is no parquet file at all.
    pq.write_table(pa.table({"body": [next(good)]}), root / "nocol.parquet")
    (root / "fake.parquet").write_bytes(b"PAR1 not a parquet footer")
    return {"kept": 3 + 2 + 1 + 2, "invalid_utf8": 3, "malformed_json": 1, "missing_text": 2,
            "empty_file": 2, "empty": 1, "too_short": 1, "too_long": 1, "truncated_tar": 2,
            "unsupported_file": 1, "unreadable_file": 1}


def digests(root: Path) -> dict[str, str]:
    """Every file of a dataset and its sha256: what "byte-identical" compares."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# Small partitions, so the corpus (~250 kB in 46 files) makes several tasks per stage.
STAGED = {"partition_bytes": 60_000, "output_format": "megatron"}
