"""Deterministic packed GPT samples over the embedded corpus.

Every sample is a pure function of (index, token stream, seq_length, seed,
name), so a resumed or re-sharded run sees exactly the samples it would have
seen uninterrupted: resuming only needs the global sample counter.
"""

from __future__ import annotations

import hashlib
import json
import operator
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
import torch
from tokenizers import Tokenizer

from data_pipeline.cache import CacheEntry, cache_key, load_entry, publish_entry
from data_pipeline.embedded import Document, EmbeddedCorpus, load_embedded_corpus
from data_pipeline.tokenizer import MIN_VOCAB_SIZE, eod_id, train_bpe_tokenizer

# Part of every dataset fingerprint: bump when the index -> window mapping
# changes so checkpoints written under the old mapping are refused.
SAMPLER_VERSION = 1
SPLITS = ("train", "valid")


@dataclass(frozen=True)
class DataConfig:
    seq_length: int
    seed: int = 1234
    vocab_size: int = 4096
    cache_dir: str = ".cache/data"
    valid_every: int = 20

    def __post_init__(self) -> None:
        if self.seq_length < 1:
            raise ValueError(f"seq_length must be >= 1, got {self.seq_length}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0 (numpy SeedSequence), got {self.seed}")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size must be >= {MIN_VOCAB_SIZE}, got {self.vocab_size}"
            )
        if self.valid_every < 2:
            raise ValueError(f"valid_every must be >= 2, got {self.valid_every}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class PackedDataset(torch.utils.data.Dataset):
    """Fixed-length windows of a token stream, reshuffled every epoch.

    Window k is ``tokens[k*L : k*L + L + 1]``: consecutive windows share one
    token so every token except the first is a label exactly once per epoch,
    as in Megatron's GPT dataset. Index ``i`` may exceed ``len(self)``; it maps
    to epoch ``i // len(self)`` whose order is its own seeded permutation.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_length: int,
        seed: int,
        name: str,
        stream_id: str | None = None,
    ) -> None:
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(
                f"tokens must be a 1-D integer array, got {tokens.dtype}{tokens.shape}"
            )
        if seq_length < 1:
            raise ValueError(f"seq_length must be >= 1, got {seq_length}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        num_windows = max(len(tokens) - 1, 0) // seq_length
        if num_windows == 0:
            raise ValueError(
                f"{name!r}: {len(tokens)} tokens cannot fill one window of {seq_length + 1}"
            )
        self.tokens = tokens
        self.seq_length = seq_length
        self.seed = seed
        self.name = name
        self.num_windows = num_windows
        if stream_id is None:
            # Without a cache key, identify the stream by content; int64 so the
            # same values in a different dtype give the same identity.
            content = np.ascontiguousarray(tokens, dtype="<i8").tobytes()
            stream_id = "sha256:" + hashlib.sha256(content).hexdigest()
        self.fingerprint = _sha256(
            json.dumps(
                {
                    "stream": stream_id,
                    "name": name,
                    "seq_length": seq_length,
                    "seed": seed,
                    "sampler_version": SAMPLER_VERSION,
                },
                sort_keys=True,
            )
        )
        # Python's hash() is salted per process, so derive a stable integer.
        self._name_key = int(_sha256(name)[:16], 16)
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return self.num_windows

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            # A private Generator: global torch/numpy RNG state stays untouched.
            rng = np.random.default_rng([self.seed, epoch, self._name_key])
            self._perm = rng.permutation(self.num_windows)
            self._perm_epoch = epoch
        return self._perm

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if isinstance(index, bool):
            raise TypeError("sample index must be an int, got bool")
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"sample index must be an int, got {type(index).__name__}"
            ) from None
        if i < 0:
            raise IndexError(f"sample index must be >= 0, got {i}")
        epoch, j = divmod(i, self.num_windows)
        start = int(self._permutation(epoch)[j]) * self.seq_length
        window = self.tokens[start : start + self.seq_length + 1]
        # astype copies, so samples never alias the (possibly read-only, mmapped) stream.
        return {
            "tokens": torch.from_numpy(window[:-1].astype(np.int64)),
            "labels": torch.from_numpy(window[1:].astype(np.int64)),
            "loss_mask": torch.ones(self.seq_length, dtype=torch.float32),
            "position_ids": torch.arange(self.seq_length, dtype=torch.int64),
        }


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def global_batch_indices(
    start_sample: int, global_batch_size: int, dp_rank: int, dp_size: int
) -> list[int]:
    """Indices in [start_sample, start_sample + global_batch_size) owned by dp_rank.

    Rank r takes the indices congruent to r mod dp_size, so the ranks partition
    each global batch and the assignment depends only on the sample counter.
    """
    for name, value in (
        ("start_sample", start_sample),
        ("global_batch_size", global_batch_size),
        ("dp_rank", dp_rank),
        ("dp_size", dp_size),
    ):
        _check_int(name, value)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank must be in [0, {dp_size}), got {dp_rank}")
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if global_batch_size % dp_size != 0:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by dp_size {dp_size}"
        )
    if start_sample < 0:
        raise ValueError(f"start_sample must be >= 0, got {start_sample}")
    if start_sample % dp_size != 0:
        raise ValueError(
            f"start_sample {start_sample} is not a multiple of dp_size {dp_size}"
        )
    return list(
        range(start_sample + dp_rank, start_sample + global_batch_size, dp_size)
    )


def collate(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    keys = samples[0].keys()
    if any(s.keys() != keys for s in samples):
        raise ValueError("all samples must have the same keys")
    return {k: torch.stack([s[k] for s in samples]) for k in keys}


def _split_documents(
    documents: Sequence[Document], valid_every: int
) -> dict[str, list[Document]]:
    """Every ``valid_every``-th document (1-based, global order) is validation."""
    splits: dict[str, list[Document]] = {name: [] for name in SPLITS}
    for position, doc in enumerate(documents, start=1):
        splits["valid" if position % valid_every == 0 else "train"].append(doc)
    return splits


def _tokenize(
    tokenizer: Tokenizer, documents: list[Document]
) -> tuple[np.ndarray, dict[str, int]]:
    """One int32 stream, EOD after each document, plus token counts per domain."""
    eod = eod_id(tokenizer)
    encodings = tokenizer.encode_batch([doc.text for doc in documents])
    pieces = []
    per_domain: dict[str, int] = {}
    for doc, encoding in zip(documents, encodings, strict=True):
        ids = encoding.ids + [eod]
        pieces.append(np.asarray(ids, dtype=np.int32))
        per_domain[doc.domain] = per_domain.get(doc.domain, 0) + len(ids)
    return np.concatenate(pieces), per_domain


def _build_entry(corpus: EmbeddedCorpus, key: str, cfg: DataConfig) -> CacheEntry:
    splits = _split_documents(corpus.documents, cfg.valid_every)
    # Trained on train documents only so validation text stays unseen.
    tokenizer = train_bpe_tokenizer(
        (doc.text for doc in splits["train"]), cfg.vocab_size
    )
    streams: dict[str, np.ndarray] = {}
    tokens_per_domain: dict[str, dict[str, int]] = {}
    for name, docs in splits.items():
        streams[name], tokens_per_domain[name] = _tokenize(tokenizer, docs)
    meta = {
        "corpus_fingerprint": corpus.fingerprint,
        "undecodable_files": corpus.undecodable_files,
        "vocab_size": cfg.vocab_size,
        "trained_vocab_size": tokenizer.get_vocab_size(),
        "valid_every": cfg.valid_every,
        "documents": {name: len(docs) for name, docs in splits.items()},
        "tokens": tokens_per_domain,
        "python_version": platform.python_version(),
        "tokenizers_version": tokenizers.__version__,
    }
    return publish_entry(Path(cfg.cache_dir), key, tokenizer, streams, meta)


def build_embedded_datasets(
    cfg: DataConfig,
) -> tuple[PackedDataset, PackedDataset, Tokenizer]:
    """(train, valid, tokenizer) for the embedded corpus, built once per cache key."""
    corpus = load_embedded_corpus()
    key = cache_key(corpus.fingerprint, cfg.vocab_size, cfg.valid_every)
    entry = load_entry(Path(cfg.cache_dir) / key)
    if entry is None:
        entry = _build_entry(corpus, key, cfg)
    train, valid = (
        PackedDataset(
            entry.streams[name], cfg.seq_length, cfg.seed, name, f"{key}:{name}"
        )
        for name in SPLITS
    )
    return train, valid, entry.tokenizer
