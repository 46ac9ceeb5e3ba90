"""On-disk cache of a trained tokenizer plus its tokenized splits.

An entry is a directory ``<cache_dir>/<key>/`` holding ``tokenizer.json``, one
``<split>.npy`` per split and ``meta.json``. Entries are assembled in a private
staging directory and published with a single ``os.rename``, so readers see
either a complete entry or none: a crash leaves only a staging directory that
nothing reads, and when two builders race, the loser discards its copy and
uses the winner's, so tokenizer and streams always come from the same build.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from data_pipeline.tokenizer import load_tokenizer

# Bump whenever tokenization, splitting or the file layout changes, so stale
# entries are never reused.
FORMAT_VERSION = 1
STAGING_PREFIX = ".staging-"
_TOKENIZER_FILE = "tokenizer.json"
_META_FILE = "meta.json"


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    tokenizer: Tokenizer
    streams: dict[str, np.ndarray]
    meta: dict[str, Any]


def cache_key(corpus_fingerprint: str, vocab_size: int, valid_every: int) -> str:
    payload = json.dumps(
        {
            "corpus": corpus_fingerprint,
            "vocab_size": vocab_size,
            "valid_every": valid_every,
            "format_version": FORMAT_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def load_entry(path: Path) -> CacheEntry | None:
    """Open a published entry, token streams memory-mapped; None if absent."""
    meta_path = path / _META_FILE
    if not path.exists():
        return None
    if not meta_path.exists():
        # Only reachable if someone edited the cache by hand: publishing is
        # all-or-nothing.
        raise RuntimeError(
            f"cache entry {path} has no {_META_FILE}; delete the directory"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise RuntimeError(
            f"cache entry {path} has format {meta.get('format_version')}"
        )
    streams = {
        name: np.load(path / f"{name}.npy", mmap_mode="r") for name in meta["splits"]
    }
    return CacheEntry(path, load_tokenizer(path / _TOKENIZER_FILE), streams, meta)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        # Without fsync a power loss after the rename could publish empty files.
        os.fsync(f.fileno())


def publish_entry(
    cache_dir: Path,
    key: str,
    tokenizer: Tokenizer,
    streams: dict[str, np.ndarray],
    meta: dict[str, Any],
) -> CacheEntry:
    """Write an entry atomically and return whichever entry ends up published."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / key
    # Staging in the same directory keeps the rename on one filesystem (atomic).
    staging = cache_dir / f"{STAGING_PREFIX}{key}-{os.getpid()}-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _write_file(
            staging / _TOKENIZER_FILE,
            lambda f: f.write(tokenizer.to_str().encode("utf-8")),
        )
        for name, stream in streams.items():
            _write_file(staging / f"{name}.npy", lambda f, s=stream: np.save(f, s))
        full_meta = {
            **meta,
            "format_version": FORMAT_VERSION,
            "splits": sorted(streams),
        }
        _write_file(
            staging / _META_FILE,
            lambda f: f.write(
                json.dumps(full_meta, indent=2, sort_keys=True).encode("utf-8")
            ),
        )
        _fsync_dir(staging)
        try:
            os.rename(staging, final)
        except OSError as exc:
            # Another process published first; its entry is equally valid.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        else:
            _fsync_dir(cache_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    entry = load_entry(final)
    if entry is None:
        raise RuntimeError(f"cache entry {final} vanished right after publishing")
    return entry
