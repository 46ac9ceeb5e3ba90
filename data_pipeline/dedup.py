"""Near-duplicate clusters from MinHash signatures: LSH bands -> candidate pairs -> verification
by exact (shingle sets) or estimated (signatures) Jaccard -> union-find.

Rows are in keep-priority order: each cluster keeps its lowest row, so the caller's ordering is
the deterministic keep rule. Candidate pairs are only a shortlist; every merge is a verified
pair, but a cluster can chain (A~B, B~C with A, C less similar), so the report gives each removed
row's estimated Jaccard to the row it was kept for and to the best verified partner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from data_pipeline.minhash import MinHashConfig, estimated_jaccard, shingle_sets

# Inside one LSH bucket, each row is paired with this many following rows: all pairs for
# buckets up to this size + 1, a chain of overlapping windows (still connected) beyond it, so a
# bucket of 100k boilerplate copies costs linear, not quadratic, work.
BUCKET_WINDOW = 32
_VERIFY_CHUNK = 4096
_BAND_BASE = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class NearDuplicates:
    """For each row: the row it is merged into (itself when kept), the estimated Jaccard to
    that row, and the verified partner with the highest verified Jaccard (-1 when kept)."""

    kept: np.ndarray
    jaccard_to_kept: np.ndarray
    partner: np.ndarray
    partner_jaccard: np.ndarray
    candidate_pairs: int
    verified_pairs: int

    @property
    def removed(self) -> np.ndarray:
        return np.flatnonzero(self.kept != np.arange(len(self.kept)))


def band_keys(sig: np.ndarray, band: int, rows: int) -> np.ndarray:
    """One uint64 per row for a band; equal bands give equal keys, and the rare unequal
    bands that collide only add candidates that verification rejects."""
    block = sig[:, band * rows:(band + 1) * rows].astype(np.uint64)
    key = np.zeros(len(sig), dtype=np.uint64)
    for col in range(rows):
        key = key * _BAND_BASE + block[:, col]
    return key


def candidate_pairs(sig: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """Unique (i, j), i < j, sharing at least one band, as an (n, 2) int64 array."""
    codes = []
    n = len(sig)
    for band in range(cfg.bands):
        keys = band_keys(sig, band, cfg.rows)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        for gap in range(1, BUCKET_WINDOW + 1):
            same = sorted_keys[:-gap] == sorted_keys[gap:]
            if not same.any():
                break  # no run longer than gap, so none longer than gap + 1 either
            left, right = order[:-gap][same], order[gap:][same]
            codes.append(np.minimum(left, right) * n + np.maximum(left, right))
    if not codes:
        return np.empty((0, 2), dtype=np.int64)
    unique = np.unique(np.concatenate(codes))
    return np.stack(divmod(unique, n), axis=1).astype(np.int64)


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


def union_find(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label of each row = its lowest row (the kept one)."""
    parent = list(range(n))
    for i, j in edges.tolist():
        ri, rj = _find(parent, i), _find(parent, j)
        if ri != rj:
            # The smaller root wins, so every root is its component's minimum.
            parent[max(ri, rj)] = min(ri, rj)
    return np.fromiter((_find(parent, x) for x in range(n)), dtype=np.int64, count=n)


def best_partners(edges: np.ndarray, edge_j: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, partner, Jaccard): every row that has an edge, its partner with the highest
    Jaccard (ties to the lower row)."""
    ends = np.concatenate([edges[:, 0], edges[:, 1]])
    others = np.concatenate([edges[:, 1], edges[:, 0]])
    weights = np.concatenate([edge_j, edge_j])
    # Visit edges from the highest Jaccard down, first one wins.
    order = np.lexsort((others, -weights, ends))
    rows, first = np.unique(ends[order], return_index=True)
    return rows, others[order][first], weights[order][first]


def estimated_jaccards(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [estimated_jaccard(sig[pairs[k:k + _VERIFY_CHUNK, 0]], sig[pairs[k:k + _VERIFY_CHUNK, 1]])
         for k in range(0, len(pairs), _VERIFY_CHUNK)] or [np.empty(0)])


def exact_jaccards(pairs: np.ndarray, texts_of: Callable[[list[int]], list[str]],
                   cfg: MinHashConfig) -> np.ndarray:
    """Exact shingle-set Jaccard of each pair; sets are built per chunk of pairs, so memory
    holds the shingles of at most 2 x _VERIFY_CHUNK documents."""
    out = np.empty(len(pairs))
    for lo in range(0, len(pairs), _VERIFY_CHUNK):
        chunk = pairs[lo:lo + _VERIFY_CHUNK]
        rows = np.unique(chunk).tolist()
        sets = dict(zip(rows, shingle_sets(cfg.view(texts_of(rows)), cfg.ngram), strict=True))
        for k, (i, j) in enumerate(chunk.tolist()):
            a, b = sets[i], sets[j]
            shared = np.intersect1d(a, b, assume_unique=True).size
            out[lo + k] = shared / (a.size + b.size - shared)
    return out


def near_duplicates(sig: np.ndarray, cfg: MinHashConfig,
                    texts_of: Callable[[list[int]], list[str]] | None = None) -> NearDuplicates:
    """``texts_of(rows)`` returns those rows' texts; needed when ``cfg.verify == "exact"``."""
    n = len(sig)
    pairs = candidate_pairs(sig, cfg)
    if cfg.verify == "exact":
        if texts_of is None:
            raise ValueError("exact verification needs the documents' texts")
        estimates = exact_jaccards(pairs, texts_of, cfg)
    else:
        estimates = estimated_jaccards(sig, pairs)
    verified = estimates >= cfg.threshold
    edges, edge_j = pairs[verified], estimates[verified]
    kept = union_find(n, edges)

    partner = np.full(n, -1, dtype=np.int64)
    partner_j = np.zeros(n)
    rows, best, best_j = best_partners(edges, edge_j)
    partner[rows], partner_j[rows] = best, best_j

    removed = kept != np.arange(n)
    jaccard_to_kept = np.ones(n)
    jaccard_to_kept[removed] = estimated_jaccard(sig[removed], sig[kept[removed]])
    partner[~removed] = -1
    partner_j[~removed] = 0.0
    return NearDuplicates(kept, jaccard_to_kept, partner, partner_j, len(pairs), len(edges))
