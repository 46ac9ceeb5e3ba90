"""Loss-driven domain weights (online data mixing / DoReMi-style exponentiated gradient), held
fixed per window of samples.

``update_weights`` is the rule: ``w' ∝ w * exp(eta * signal)`` with ``signal = loss - reference``
(or, DoReMi's excess loss, ``max(loss - reference, 0)``), blended with the previous weights by
``smoothing`` and projected onto ``w >= floor``. ``MixingSchedule`` is the history of windows
``(start_sample, weights)``: the blend of a window is fixed by its weights alone, so the schedule
(``state_dict()``) plus the consumed sample count is all a checkpoint needs to resume exactly.

Windows are decided ahead of the samples they govern: append a window starting at or after the
next sample the loader has not produced yet, then restart the data iterator from the consumed
count (DataLoader workers hold their own copy of the dataset, schedule included).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MixingConfig:
    eta: float = 1.0
    floor: float = 0.05
    smoothing: float = 0.5  # share of the previous weights kept in each update
    excess_loss: bool = False

    def __post_init__(self) -> None:
        if not (np.isfinite(self.eta) and self.eta >= 0):
            raise ValueError(f"eta must be finite and >= 0, got {self.eta}")
        if not 0.0 <= self.floor < 1.0:
            raise ValueError(f"floor must be in [0, 1), got {self.floor}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")


def _vector(name: str, values: Sequence[float], n: int | None = None) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or (n is not None and len(v) != n):
        raise ValueError(f"{name} must be a list of {n or 'some'} numbers, got {values!r}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite, got {list(values)}")
    return v


def normalized(weights: Sequence[float]) -> np.ndarray:
    w = _vector("weights", weights)
    if len(w) == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 and not all 0, got {list(weights)}")
    return w / w.sum()


def apply_floor(weights: np.ndarray, floor: float) -> np.ndarray:
    """The closest weights (same proportions above the floor) with every entry >= floor."""
    if floor * len(weights) > 1.0:
        raise ValueError(f"floor {floor} x {len(weights)} domains exceeds 1")
    w = normalized(weights)
    pinned = np.zeros(len(w), dtype=bool)
    # Pinning a domain to the floor shrinks the others, which can push more below it; at most
    # one pass per domain.
    while True:
        free = ~pinned
        w[pinned] = floor
        w[free] = w[free] / w[free].sum() * (1.0 - floor * pinned.sum())
        below = free & (w < floor)
        if not below.any():
            return w
        pinned |= below


def update_weights(weights: Sequence[float], losses: Sequence[float], cfg: MixingConfig,
                   reference: Sequence[float] | None = None) -> np.ndarray:
    w = normalized(weights)
    loss = _vector("losses", losses, len(w))
    if reference is None:
        if cfg.excess_loss:
            raise ValueError("excess_loss needs reference losses")
        signal = loss
    else:
        signal = loss - _vector("reference", reference, len(w))
        if cfg.excess_loss:
            signal = np.maximum(signal, 0.0)
    # Shifting the signal by a constant cancels in the normalization and keeps exp() finite.
    proposed = w * np.exp(cfg.eta * (signal - signal.max()))
    proposed /= proposed.sum()
    return apply_floor(cfg.smoothing * w + (1.0 - cfg.smoothing) * proposed, cfg.floor)


class MixingSchedule:
    """Per-domain weights by window: ``windows[k] = (start_sample, weights)``, first start 0."""

    def __init__(self, domains: Sequence[str], weights: Sequence[float] | Mapping[str, float]):
        if len(set(domains)) != len(domains) or not domains:
            raise ValueError(f"domains must be distinct and non-empty, got {list(domains)}")
        self.domains = tuple(domains)
        self._windows: list[tuple[int, tuple[float, ...]]] = []
        self.revision = 0
        self.append(0, weights)

    @property
    def windows(self) -> tuple[tuple[int, tuple[float, ...]], ...]:
        return tuple(self._windows)

    def _as_list(self, name: str, values: Sequence[float] | Mapping[str, float]) -> list[float]:
        if isinstance(values, Mapping):
            if set(values) != set(self.domains):
                raise ValueError(f"{name} must name exactly the domains {list(self.domains)}, "
                                 f"got {sorted(values)}")
            return [float(values[d]) for d in self.domains]
        return [float(v) for v in _vector(name, values, len(self.domains))]

    def append(self, start_sample: int, weights: Sequence[float] | Mapping[str, float]) -> None:
        w = normalized(self._as_list("weights", weights))
        self._add(int(start_sample), tuple(float(x) for x in w))

    def _add(self, start_sample: int, weights: tuple[float, ...]) -> None:
        if self._windows and start_sample <= self._windows[-1][0]:
            raise ValueError(f"a new window must start after sample {self._windows[-1][0]}, "
                             f"got {start_sample}")
        if not self._windows and start_sample != 0:
            raise ValueError("the first window must start at sample 0")
        self._windows.append((start_sample, weights))
        self.revision += 1

    def weights_at(self, sample: int) -> tuple[float, ...]:
        starts = [start for start, _ in self._windows]
        return self._windows[int(np.searchsorted(starts, sample, side="right")) - 1][1]

    def update(self, start_sample: int, losses: Sequence[float] | Mapping[str, float],
               cfg: MixingConfig, reference: Sequence[float] | Mapping[str, float] | None = None
               ) -> tuple[float, ...]:
        """Append the window that follows from the last weights and these per-domain losses."""
        ref = None if reference is None else self._as_list("reference", reference)
        new = update_weights(self._windows[-1][1], self._as_list("losses", losses), cfg, ref)
        self.append(start_sample, new.tolist())
        return self._windows[-1][1]

    def state_dict(self) -> dict[str, Any]:
        return {"domains": list(self.domains),
                "windows": [[start, list(w)] for start, w in self._windows]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state.get("domains", [])) != list(self.domains):
            raise ValueError(f"mixing state is for domains {state.get('domains')}, this schedule "
                             f"has {list(self.domains)}")
        checked = []
        for start, weights in state.get("windows") or []:
            values = self._as_list("weights", weights)
            normalized(values)  # the checks a new window gets; the values are kept verbatim,
            checked.append((int(start), tuple(values)))  # as renormalizing could move a bit
        starts = [start for start, _ in checked]
        if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"mixing state windows must start at 0 and increase, got {starts}")
        self._windows = checked
        self.revision += 1
