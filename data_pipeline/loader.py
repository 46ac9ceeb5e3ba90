"""Map-style, blended, packed GPT samples over prepared WebDataset shards.

Sample i is a pure function of (i, config, mixing windows up to i):

1. the blend (``blend.WindowedBlend``) maps i to a component (a domain, or a whole dataset
   with ``--data-path``) and to that component's own sample counter j;
2. component sample j is window ``j mod W`` (in an order reshuffled every epoch) of the
   component's documents, concatenated in an order reshuffled every epoch, each followed by EOD;
   windows are ``seq_length + 1`` tokens and overlap by one, as Megatron's GPT dataset.

Both shuffles draw from private numpy Generators seeded with (seed, component, epoch), never
from global RNG state. Nothing depends on access order or on which process reads, so resuming
needs only the consumed sample count (plus the mixing windows when weights are dynamic), with
any number of DataLoader workers.
"""

from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data_pipeline.blend import DEFAULT_RESOLUTION, WindowedBlend
from data_pipeline.manifest import DatasetError, json_sha256
from data_pipeline.mixing import MixingSchedule
from data_pipeline.shard_reader import DocumentStore

# Part of the fingerprint: bump whenever the index -> sample mapping changes.
SAMPLER_VERSION = 1


@dataclass(frozen=True)
class LoaderConfig:
    seq_length: int
    seed: int = 1234
    # Megatron's --eod-mask-loss: no loss where the input token is EOD (predicting the first
    # token of an unrelated next document).
    eod_mask_loss: bool = True
    # Weights are realized exactly as multiples of 1/resolution (see blend.quantize).
    resolution: int = DEFAULT_RESOLUTION
    verify_shards: bool = False  # re-hash every shard on open (reads every byte)
    # Document-level hold-out: every `valid_every`-th document of each component (in index
    # order) is validation; "train" takes the rest, "all" everything.
    split: str = "all"
    valid_every: int = 20
    # tokenizer.json of Megatron prefixes that are not ours (they carry no tokenizer)
    tokenizer_model: str | None = None

    def __post_init__(self) -> None:
        if self.resolution < 1:
            raise ValueError(f"resolution must be >= 1, got {self.resolution}")
        if self.seq_length < 1:
            raise ValueError(f"seq_length must be >= 1, got {self.seq_length}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.split not in ("all", "train", "valid"):
            raise ValueError(f"split must be all, train or valid, got {self.split!r}")
        if self.valid_every < 2:
            raise ValueError(f"valid_every must be >= 2, got {self.valid_every}")


def _stable_key(name: str) -> int:
    # hash() is salted per process; workers must agree.
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16], 16)


class _PackedComponent:
    """Fixed-length windows over one component's documents, reshuffled every epoch."""

    def __init__(self, name: str, docs: np.ndarray, store: DocumentStore, cfg: LoaderConfig):
        self.name = name
        self.docs = docs
        self.store = store
        self.seq_length = cfg.seq_length
        self.seed = cfg.seed
        self.key = _stable_key(name)
        self.lengths = store.tokens[docs] + 1  # each document is followed by EOD
        total = int(self.lengths.sum())
        self.windows_per_epoch = max(total - 1, 0) // cfg.seq_length
        if self.windows_per_epoch == 0:
            raise DatasetError(f"component {name!r}: {total} tokens (EOD included) cannot fill "
                               f"one window of {cfg.seq_length + 1}")
        self._epoch = -1
        self._order = self._ends = self._windows = np.empty(0, dtype=np.int64)

    def _shuffle(self, epoch: int) -> None:
        if epoch != self._epoch:
            doc_rng = np.random.default_rng([self.seed, self.key, epoch, 0])
            window_rng = np.random.default_rng([self.seed, self.key, epoch, 1])
            self._order = doc_rng.permutation(len(self.docs))
            self._ends = np.cumsum(self.lengths[self._order])
            self._windows = window_rng.permutation(self.windows_per_epoch)
            self._epoch = epoch

    def window(self, j: int) -> np.ndarray:
        epoch, k = divmod(j, self.windows_per_epoch)
        self._shuffle(epoch)
        size = self.seq_length + 1
        pos = int(self._windows[k]) * self.seq_length
        out = np.empty(size, dtype=np.int64)
        filled = 0
        d = int(np.searchsorted(self._ends, pos, side="right"))
        while filled < size:
            doc = int(self.docs[self._order[d]])
            n = int(self.store.tokens[doc])
            offset = pos - (int(self._ends[d]) - n - 1)
            take = min(n + 1 - offset, size - filled)
            text = max(min(offset + take, n) - offset, 0)
            out[filled:filled + text] = self.store.read(doc)[offset:offset + text]
            if take > text:
                out[filled + text] = self.store.eod_id
            filled += take
            pos += take
            d += 1
        return out


class BlendedDataset(torch.utils.data.Dataset):
    """Blended, packed samples in ``PackedDataset``'s format. ``len()`` is one pass over every
    component's windows; any index >= 0 is valid (later epochs)."""

    def __init__(self, store: DocumentStore, components: Mapping[str, np.ndarray],
                 schedule: MixingSchedule, cfg: LoaderConfig) -> None:
        if list(components) != list(schedule.domains):
            raise ValueError(f"schedule domains {list(schedule.domains)} differ from the "
                             f"components {list(components)}")
        self.store = store
        self.cfg = cfg
        self.schedule = schedule
        self.components = [_PackedComponent(name, np.asarray(docs, dtype=np.int64), store, cfg)
                           for name, docs in components.items()]
        identity = {
            "sampler_version": SAMPLER_VERSION,
            "components": {c.name: hashlib.sha256(c.docs.tobytes()).hexdigest()
                           for c in self.components},
            "initial_weights": schedule.windows[0][1],
            "seq_length": cfg.seq_length,
            "seed": cfg.seed,
            "eod_mask_loss": cfg.eod_mask_loss,
            "split": [cfg.split, cfg.valid_every],
            "resolution": cfg.resolution,
        }
        self.fingerprint = json_sha256({**identity, "datasets": store.fingerprints})
        # Until 2026-12-06 the datasets entered by their manifests' own fingerprints, which
        # also hash where their input lay: checkpoints saved then carry this one.
        self.legacy_fingerprint = json_sha256({**identity,
                                               "datasets": store.manifest_fingerprints})
        self._blend_revision = -1
        self._blend: WindowedBlend | None = None
        self._positions = torch.arange(cfg.seq_length, dtype=torch.int64)

    def __len__(self) -> int:
        return sum(c.windows_per_epoch for c in self.components)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component, that component's sample counter) of each global sample index."""
        if self._blend is None or self._blend_revision != self.schedule.revision:
            self._blend = WindowedBlend(self.schedule.windows, self.cfg.resolution)
            self._blend_revision = self.schedule.revision
        return self._blend.lookup(np.asarray(indices, dtype=np.int64))

    def _sample(self, component: int, j: int) -> dict[str, torch.Tensor]:
        window = torch.from_numpy(self.components[component].window(j))
        tokens = window[:-1]
        loss_mask = torch.ones(self.cfg.seq_length, dtype=torch.float32)
        if self.cfg.eod_mask_loss:
            loss_mask[tokens == self.store.eod_id] = 0.0
        return {"tokens": tokens, "labels": window[1:].clone(), "loss_mask": loss_mask,
                "position_ids": self._positions.clone()}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """A whole micro-batch at once (DataLoader calls this): one vectorized blend lookup."""
        checked = [_check_index(i) for i in indices]
        components, counters = self.locate(checked)
        return [self._sample(c, j) for c, j in zip(components.tolist(), counters.tolist(),
                                                     strict=True)]


def _check_index(index: int) -> int:
    if isinstance(index, bool):
        raise TypeError("sample index must be an int, got bool")
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"sample index must be an int, got {type(index).__name__}") from None
    if i < 0:
        raise IndexError(f"sample index must be >= 0, got {i}")
    return i


def _split(docs: np.ndarray, cfg: LoaderConfig) -> np.ndarray:
    if cfg.split == "all":
        return docs
    held_out = np.arange(len(docs)) % cfg.valid_every == cfg.valid_every - 1
    return docs[held_out] if cfg.split == "valid" else docs[~held_out]


def parse_data_path(data_path: Sequence[str]) -> list[tuple[float, str]]:
    """Megatron's ``--data-path``: ``DIR`` or ``W1 DIR1 W2 DIR2 ...``; each DIR a prepared
    dataset directory or a Megatron ``.bin``/``.idx`` prefix."""
    items = list(data_path)
    if len(items) == 1:
        return [(1.0, items[0])]
    if not items or len(items) % 2:
        raise ValueError(f"--data-path takes DIR or pairs of WEIGHT DIR, got {items}")
    pairs = []
    for weight, path in zip(items[::2], items[1::2], strict=True):
        try:
            pairs.append((float(weight), path))
        except ValueError:
            raise ValueError(f"--data-path: {weight!r} is not a weight (WEIGHT DIR pairs)") \
                from None
    return pairs


def blend_datasets(data_path: Sequence[str], cfg: LoaderConfig,
                   schedule: MixingSchedule | None = None) -> BlendedDataset:
    """One component per prepared dataset directory, weighted as in ``--data-path``."""
    pairs = parse_data_path(data_path)
    dirs = [os.fspath(Path(p)) for _, p in pairs]
    if len(set(dirs)) != len(dirs):
        raise ValueError(f"--data-path names a directory twice: {dirs}")
    store = DocumentStore(dirs, cfg.verify_shards, cfg.tokenizer_model)
    components = {d: _split(np.flatnonzero(store.dataset == k), cfg)
                  for k, d in enumerate(dirs)}
    if schedule is None:
        schedule = MixingSchedule(dirs, [w for w, _ in pairs])
    return BlendedDataset(store, components, schedule, cfg)


def blend_domains(dataset_dirs: Sequence[str | os.PathLike[str]],
                  weights: Mapping[str, float] | MixingSchedule,
                  cfg: LoaderConfig) -> BlendedDataset:
    """One component per domain (pooled over the given datasets), with per-domain weights or a
    mixing schedule over the domains."""
    store = DocumentStore(dataset_dirs, cfg.verify_shards, cfg.tokenizer_model)
    schedule = weights if isinstance(weights, MixingSchedule) else \
        MixingSchedule(list(weights), weights)
    unknown = sorted(set(schedule.domains) - set(store.domain_names))
    if unknown:
        raise DatasetError(f"no domain {unknown} in {[str(d) for d in dataset_dirs]} "
                           f"(domains: {store.domain_names})")
    components = {name: _split(np.flatnonzero(store.domain == store.domain_names.index(name)),
                               cfg)
                  for name in schedule.domains}
    return BlendedDataset(store, components, schedule, cfg)
