"""The default training corpus, built only from text that ships with CPython 3.11.

Nothing is downloaded: the ``code`` domain is standard-library source and the
``prose`` domain is the English help text behind ``help('topics')``. Both vary
slightly between Python patch releases, so the corpus carries a content
fingerprint that cache keys and checkpoints can compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import pydoc_data.topics
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Enough code for a tokenizer and a short pretraining run, small enough that a
# cold build takes seconds. Measured in UTF-8 bytes of source.
CODE_BUDGET_BYTES = 3_000_000

# Test suites are excluded because they are huge, repetitive and full of
# deliberately odd encodings; site-packages because it differs per install.
_EXCLUDED_DIR_NAMES = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "site-packages",
        "dist-packages",
        "__pycache__",
    }
)
# Build-configuration files embed machine paths and compiler flags, so they
# would make the corpus (and its fingerprint) differ between installs.
_EXCLUDED_TOP_DIR_PREFIX = "config-"
_EXCLUDED_FILE_PREFIX = "_sysconfigdata_"
# Prose lives in its own domain; keeping it out of ``code`` avoids duplication.
_EXCLUDED_FILES = frozenset({"pydoc_data/topics.py"})


@dataclass(frozen=True)
class Document:
    domain: str
    source_id: str
    text: str


@dataclass(frozen=True)
class EmbeddedCorpus:
    documents: tuple[Document, ...]
    fingerprint: str
    undecodable_files: int


def corpus_fingerprint(documents: tuple[Document, ...] | list[Document]) -> str:
    """sha256 over every document's fields, in order.

    Each field is length-prefixed so that moving text between adjacent fields
    or documents cannot produce the same digest.
    """
    digest = hashlib.sha256()
    for doc in documents:
        for field in (doc.domain, doc.source_id, doc.text):
            data = field.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def _stdlib_sources(stdlib_dir: Path) -> list[str]:
    """Relative POSIX paths of eligible ``.py`` files, sorted as strings."""
    found = []
    for root, dirs, files in os.walk(stdlib_dir):
        rel_root = Path(root).relative_to(stdlib_dir)
        at_top = rel_root == Path(".")
        dirs[:] = [
            d
            for d in dirs
            if d not in _EXCLUDED_DIR_NAMES
            and not (at_top and d.startswith(_EXCLUDED_TOP_DIR_PREFIX))
        ]
        for name in files:
            if not name.endswith(".py") or name.startswith(_EXCLUDED_FILE_PREFIX):
                continue
            rel = (rel_root / name).as_posix()
            if rel not in _EXCLUDED_FILES:
                found.append(rel)
    return sorted(found)


def _code_documents(stdlib_dir: Path, budget_bytes: int) -> tuple[list[Document], int]:
    docs: list[Document] = []
    undecodable = 0
    total = 0
    for rel in _stdlib_sources(stdlib_dir):
        if total >= budget_bytes:
            break
        raw = (stdlib_dir / rel).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
            continue
        docs.append(Document("code", f"stdlib:{rel}", text))
        total += len(raw)
    return docs, undecodable


def _prose_documents() -> list[Document]:
    topics = pydoc_data.topics.topics
    return [Document("prose", f"pydoc:{key}", topics[key]) for key in sorted(topics)]


def load_embedded_corpus(
    stdlib_dir: str | os.PathLike[str] | None = None,
    code_budget_bytes: int = CODE_BUDGET_BYTES,
) -> EmbeddedCorpus:
    """Code documents (sorted by path) followed by prose documents (sorted by topic)."""
    root = Path(
        stdlib_dir if stdlib_dir is not None else sysconfig.get_paths()["stdlib"]
    )
    code, undecodable = _code_documents(root, code_budget_bytes)
    documents = tuple(code + _prose_documents())
    return EmbeddedCorpus(documents, corpus_fingerprint(documents), undecodable)


def embedded_corpus() -> list[Document]:
    return list(load_embedded_corpus().documents)


def prepare_embedded(cache_dir: str | os.PathLike[str], vocab_size: int) -> Path:
    """The embedded corpus through the full `prepare` pipeline (normalize, dedup, BPE, shards),
    once per (corpus, vocabulary): the trainer's default dataset. Safe to call from several
    processes; `prepare` publishes its output with an atomic rename."""
    from data_pipeline.executors.local import LocalExecutor
    from data_pipeline.prepare import PrepareConfig, prepare
    from data_pipeline.sources import DomainSource

    corpus = load_embedded_corpus()
    key = hashlib.sha256(f"{corpus.fingerprint}:{vocab_size}:v3".encode()).hexdigest()[:16]
    output = Path(cache_dir) / f"embedded-{key}"
    if (output / "manifest.json").is_file():
        return output
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        sources = []
        for domain in sorted({doc.domain for doc in corpus.documents}):
            folder = Path(tmp) / domain
            folder.mkdir()
            with open(folder / "docs.jsonl", "w", encoding="utf-8") as f:
                for doc in corpus.documents:
                    if doc.domain == domain:
                        f.write(json.dumps({"text": doc.text}) + "\n")
            sources.append(DomainSource(domain, str(folder)))
        # In this process: the trainer calls this, and a pool's fresh processes would
        # re-import the training script.
        prepare(PrepareConfig(sources=tuple(sources), output=output, vocab_size=vocab_size,
                              progress=False), LocalExecutor(0))
    return output
