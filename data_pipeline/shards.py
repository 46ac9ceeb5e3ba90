"""Writing tokenized documents as WebDataset shards plus a per-shard index.

Each document is one WebDataset sample ``<key>.tokens.i32`` (raw little-endian int32),
``<key>.domain.txt`` and ``<key>.source_id.txt``. The index of a shard is a numpy file with one
row per document: the byte offset of its token payload inside the tar, its token count and its
domain id. Readers seek straight to a document through it, never through WebDataset's iterator,
whose position cannot be restored exactly with several workers.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import webdataset as wds

from data_pipeline.manifest import INDEX_DTYPE, TOKEN_DTYPE, TOKENS_EXT, file_sha256

SHARD_PATTERN = "shard-%06d.tar"


@dataclass(frozen=True)
class ShardInfo:
    tar: str
    index: str
    documents: int
    tokens: int
    bytes: int
    sha256: str


def index_name(tar_name: str) -> str:
    return tar_name.removesuffix(".tar") + ".idx.npy"


class ShardSink:
    """Writes documents in order; ``close()`` builds every shard's index and returns them."""

    def __init__(self, out_dir: Path, max_docs: int, max_bytes: int, first_key: int = 0) -> None:
        if max_docs < 1 or max_bytes < 1:
            raise ValueError(f"shard limits must be >= 1, got {max_docs} docs, {max_bytes} bytes")
        self.out_dir = out_dir
        # mtime fixed: the same input gives byte-identical shards, hence the same fingerprint;
        # an int, since a float mtime makes tarfile add a pax header to every member.
        self._writer = wds.ShardWriter(str(out_dir / SHARD_PATTERN), maxcount=max_docs,
                                       maxsize=max_bytes, verbose=0, mtime=0)
        self._expected: dict[str, list[tuple[str, int, int]]] = {}
        self._count = first_key  # keys number documents across the whole dataset

    def write(self, tokens: np.ndarray, domain_id: int, domain: str, source_id: str) -> None:
        key = f"{self._count:010d}"
        self._count += 1
        self._writer.write({
            "__key__": key,
            TOKENS_EXT: np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes(),
            "domain.txt": domain,
            "source_id.txt": source_id,
        })
        name = Path(self._writer.fname).name
        self._expected.setdefault(name, []).append((key, len(tokens), domain_id))

    def close(self) -> list[ShardInfo]:
        self._writer.close()
        return [self._index(name, docs) for name, docs in self._expected.items()]

    def _index(self, name: str, docs: list[tuple[str, int, int]]) -> ShardInfo:
        path = self.out_dir / name
        offsets = {}
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if ext == TOKENS_EXT:
                    offsets[key] = member.offset_data
        index = np.zeros(len(docs), dtype=INDEX_DTYPE)
        for row, (key, n_tokens, domain_id) in enumerate(docs):
            index[row] = (offsets[key], n_tokens, domain_id)
        np.save(self.out_dir / index_name(name), index, allow_pickle=False)
        return ShardInfo(name, index_name(name), len(docs), int(index["tokens"].sum()),
                         path.stat().st_size, file_sha256(path))
