"""Random access to the documents of prepared datasets through their shard indexes (and of
Megatron ``.bin``/``.idx`` prefixes through theirs: ``megatron_format``).

A document is read by memory-mapping its tar and viewing the int32 payload at the indexed
offset: no tar parsing, no iterator state. Maps are opened lazily and per process (a
DataLoader worker that inherits or unpickles the store opens its own), so the store is safe to
hand to any number of workers.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.manifest import (
    TOKEN_DTYPE,
    TOKENIZER_FILE,
    DatasetError,
    content_fingerprint,
    file_sha256,
    load_index,
    load_manifest,
)
from data_pipeline.megatron_format import MegatronDocuments, is_prefix, open_prefix


def _tokenizer_record(path: Path) -> dict[str, Any]:
    from data_pipeline.tokenizer import eod_id, load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except ValueError as exc:
        raise DatasetError(f"--tokenizer-model {path}: {exc}") from None
    return {"sha256": file_sha256(path), "eod_id": eod_id(tokenizer),
            "vocab_size": tokenizer.get_vocab_size()}


class DocumentStore:
    """Every document of one or more prepared datasets or Megatron prefixes (all tokenized by
    the same tokenizer), numbered in dataset, shard, index order. A path is a Megatron prefix
    when PATH.bin and PATH.idx exist (its domain is the prefix's name), a directory of
    ``prepare`` otherwise."""

    def __init__(self, dataset_dirs: Sequence[str | os.PathLike[str]],
                 verify_shards: bool = False, tokenizer: str | os.PathLike[str] | None = None
                 ) -> None:
        if not dataset_dirs:
            raise DatasetError("no dataset directory given")
        self.dataset_dirs = [Path(d) for d in dataset_dirs]
        given = None if tokenizer is None else _tokenizer_record(Path(tokenizer))
        self.manifests = []
        prefixes: dict[int, MegatronDocuments] = {}
        for k, d in enumerate(self.dataset_dirs):
            if not is_prefix(d):
                self.manifests.append(load_manifest(d, verify_shards))
                continue
            prefixes[k] = docs = open_prefix(d)
            record = given or (load_manifest(docs.manifest.parent)["tokenizer"] if docs.manifest
                               else None)
            if record is None:
                raise DatasetError(f"{d}: a Megatron dataset without our manifest.json two "
                                   f"levels up: give the tokenizer it was made with "
                                   f"(--tokenizer-model tokenizer.json)")
            self.manifests.append({"domains": [d.name], "tokenizer": record,
                                   "fingerprint": docs.fingerprint, "shards": [],
                                   "megatron_prefix": True})
        # The tokenizer.json these documents were made with (a checkpoint copies it).
        first = self.dataset_dirs[0]
        self.tokenizer_file: Path = Path(tokenizer) if tokenizer is not None else (
            prefixes[0].manifest.parent if 0 in prefixes else first) / TOKENIZER_FILE
        tokenizers = {m["tokenizer"]["sha256"] for m in self.manifests}
        if len(tokenizers) != 1:
            raise DatasetError(f"datasets {[str(d) for d in self.dataset_dirs]} were tokenized "
                               f"with {len(tokenizers)} different tokenizers")
        self.eod_id: int = self.manifests[0]["tokenizer"]["eod_id"]
        self.vocab_size: int = self.manifests[0]["tokenizer"]["vocab_size"]
        self.domain_names: list[str] = sorted({d for m in self.manifests for d in m["domains"]})
        self.shard_paths: list[Path] = []
        self.shard_dtypes: list[np.dtype] = []
        dataset, shard, offset, tokens, domain = [], [], [], [], []
        for k, (root, manifest) in enumerate(zip(self.dataset_dirs, self.manifests, strict=True)):
            to_global = np.array([self.domain_names.index(d) for d in manifest["domains"]],
                                 dtype=np.int32)
            if k in prefixes:
                docs = prefixes[k]
                n = len(docs.tokens)
                dataset.append(np.full(n, k, dtype=np.int32))
                shard.append(np.full(n, len(self.shard_paths), dtype=np.int32))
                offset.append(docs.offsets)
                tokens.append(docs.tokens)
                domain.append(np.full(n, to_global[0], dtype=np.int32))
                self.shard_paths.append(docs.bin_path)
                self.shard_dtypes.append(docs.dtype)
                continue
            for entry in manifest["shards"]:
                index = load_index(root, entry)
                dataset.append(np.full(len(index), k, dtype=np.int32))
                shard.append(np.full(len(index), len(self.shard_paths), dtype=np.int32))
                offset.append(index["offset"])
                tokens.append(index["tokens"])
                domain.append(to_global[index["domain"]])
                self.shard_paths.append(root / entry["tar"])
                self.shard_dtypes.append(TOKEN_DTYPE)
        self.dataset = np.concatenate(dataset)
        self.shard = np.concatenate(shard)
        self.offset = np.concatenate(offset)
        self.tokens = np.concatenate(tokens)
        self.domain = np.concatenate(domain)
        self._maps: dict[int, mmap.mmap] = {}
        self._pid = os.getpid()

    @property
    def fingerprints(self) -> list[str]:
        """Per dataset, what it holds (`manifest.content_fingerprint`; a Megatron prefix's .idx
        hash and .bin size)."""
        return [m["fingerprint"] if m.get("megatron_prefix") else content_fingerprint(m)
                for m in self.manifests]

    @property
    def manifest_fingerprints(self) -> list[str]:
        """Per dataset, the manifest's own fingerprint (its input's folders included): what
        the data fingerprint of checkpoints saved before 2026-12-06 was made of."""
        return [m["fingerprint"] for m in self.manifests]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getstate__(self) -> dict[str, Any]:
        # mmaps do not pickle, and a worker must open its own anyway.
        state = dict(self.__dict__)
        state["_maps"] = {}
        return state

    def _map(self, shard: int) -> mmap.mmap:
        if self._pid != os.getpid():
            self._maps = {}  # inherited through fork: reopen in this process
            self._pid = os.getpid()
        m = self._maps.get(shard)
        if m is None:
            with open(self.shard_paths[shard], "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = m
        return m

    def read(self, doc: int) -> np.ndarray:
        """Document ``doc``'s tokens: a read-only int32 view of the mapped shard."""
        shard = int(self.shard[doc])
        return np.frombuffer(self._map(shard), dtype=self.shard_dtypes[shard],
                             count=int(self.tokens[doc]), offset=int(self.offset[doc]))
