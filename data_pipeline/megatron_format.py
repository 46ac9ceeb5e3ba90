"""Megatron's indexed format (``PREFIX.bin`` / ``PREFIX.idx``) as a source for the loader.

The index is read with megatron-core's own ``IndexedDataset``; a document is the run of
sequences between two of its ``document_indices`` (one sequence per document for the files
``prepare --output-format megatron`` writes; ``preprocess_data.py`` may split documents into
sentences), contiguous in the ``.bin``, so it is read as one memory-mapped view like a shard
payload. A Megatron dataset carries no tokenizer: ours has ``manifest.json`` two levels up
(``OUTPUT/megatron/DOMAIN``); any other needs the tokenizer it was made with
(``--tokenizer-model tokenizer.json``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_pipeline.manifest import MANIFEST, DatasetError, file_sha256


def is_prefix(path: str | os.PathLike[str]) -> bool:
    """A Megatron dataset prefix: PATH.bin and PATH.idx exist (a directory is ours)."""
    p = os.fspath(path)
    return os.path.isfile(p + ".bin") and os.path.isfile(p + ".idx")


@dataclass(frozen=True)
class MegatronDocuments:
    bin_path: Path
    offsets: np.ndarray  # byte offset of each document in the .bin
    tokens: np.ndarray  # tokens per document
    dtype: np.dtype
    fingerprint: str
    manifest: Path | None  # our prepare's manifest.json, when the prefix is ours


def open_prefix(prefix: str | os.PathLike[str]) -> MegatronDocuments:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = os.fspath(prefix)
    try:
        data = IndexedDataset(prefix, multimodal=False, mmap=True)
    except (OSError, ValueError, AssertionError) as exc:
        raise DatasetError(f"{prefix}: not a readable Megatron dataset ({exc})") from None
    bounds = np.asarray(data.document_indices, dtype=np.int64)
    lengths = np.asarray(data.sequence_lengths, dtype=np.int64)
    pointers = np.asarray(data.index.sequence_pointers, dtype=np.int64)
    ends = np.concatenate([[0], np.cumsum(lengths)])
    docs = bounds[:-1]
    tokens = ends[bounds[1:]] - ends[docs]
    dtype = np.dtype(data.index.dtype).newbyteorder("<")
    offsets = pointers[np.minimum(docs, len(pointers) - 1)] if len(pointers) else docs
    bin_path = Path(prefix + ".bin")
    size = bin_path.stat().st_size
    last = int((offsets + tokens * dtype.itemsize).max()) if len(docs) else 0
    if last > size:  # megatron-core maps the .bin without checking it against the .idx
        raise DatasetError(f"{bin_path}: {size} bytes, its .idx points to byte {last} "
                           "(truncated, or not the .idx's .bin)")
    digest = hashlib.sha256(file_sha256(Path(prefix + ".idx")).encode())
    digest.update(str(size).encode())
    ours = Path(prefix).parent.parent / MANIFEST
    return MegatronDocuments(bin_path, offsets, tokens, dtype, digest.hexdigest(),
                             ours if ours.is_file() else None)
