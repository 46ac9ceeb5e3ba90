"""Random access to the documents of prepared datasets through their shard indexes.

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

from data_pipeline.manifest import TOKEN_DTYPE, DatasetError, load_index, load_manifest


class DocumentStore:
    """Every document of one or more prepared datasets (all tokenized by the same tokenizer),
    numbered in dataset, shard, index order."""

    def __init__(self, dataset_dirs: Sequence[str | os.PathLike[str]],
                 verify_shards: bool = False) -> None:
        if not dataset_dirs:
            raise DatasetError("no dataset directory given")
        self.dataset_dirs = [Path(d) for d in dataset_dirs]
        self.manifests = [load_manifest(d, verify_shards) for d in self.dataset_dirs]
        tokenizers = {m["tokenizer"]["sha256"] for m in self.manifests}
        if len(tokenizers) != 1:
            raise DatasetError(f"datasets {[str(d) for d in self.dataset_dirs]} were tokenized "
                               f"with {len(tokenizers)} different tokenizers")
        self.eod_id: int = self.manifests[0]["tokenizer"]["eod_id"]
        self.vocab_size: int = self.manifests[0]["tokenizer"]["vocab_size"]
        self.domain_names: list[str] = sorted({d for m in self.manifests for d in m["domains"]})
        self.shard_paths: list[Path] = []
        dataset, shard, offset, tokens, domain = [], [], [], [], []
        for k, (root, manifest) in enumerate(zip(self.dataset_dirs, self.manifests, strict=True)):
            to_global = np.array([self.domain_names.index(d) for d in manifest["domains"]],
                                 dtype=np.int32)
            for entry in manifest["shards"]:
                index = load_index(root, entry)
                dataset.append(np.full(len(index), k, dtype=np.int32))
                shard.append(np.full(len(index), len(self.shard_paths), dtype=np.int32))
                offset.append(index["offset"])
                tokens.append(index["tokens"])
                domain.append(to_global[index["domain"]])
                self.shard_paths.append(root / entry["tar"])
        self.dataset = np.concatenate(dataset)
        self.shard = np.concatenate(shard)
        self.offset = np.concatenate(offset)
        self.tokens = np.concatenate(tokens)
        self.domain = np.concatenate(domain)
        self._maps: dict[int, mmap.mmap] = {}
        self._pid = os.getpid()

    @property
    def fingerprints(self) -> list[str]:
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
        return np.frombuffer(self._map(int(self.shard[doc])), dtype=TOKEN_DTYPE,
                             count=int(self.tokens[doc]), offset=int(self.offset[doc]))
