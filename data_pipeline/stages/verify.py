"""Stage 5, one task per range of pair hashes: verify candidate pairs.

Exact shingle-set Jaccard of the two texts in shingle view (or the signature estimate with
``--verify estimated``); pairs at or above the threshold become edges ``(i, j, jaccard)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_pipeline.dedup import estimated_jaccards, exact_jaccards
from data_pipeline.stages.common import Plan, Texts, partition_rows, task_dir, write_json

EDGES_DTYPE = np.dtype([("i", "<i8"), ("j", "<i8"), ("jaccard", "<f8")])


def tasks(plan: Plan) -> int:
    return plan.verify_tasks if plan.near_dedup else 0


class Signatures:
    """Signatures by global row, one partition's file open at a time."""

    def __init__(self, work: Path, plan: Plan, starts: np.ndarray) -> None:
        self.work, self.plan, self.starts = work, plan, starts

    def get(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.plan.minhash.num_perm), dtype=np.uint32)
        parts = np.searchsorted(self.starts, rows, side="right") - 1
        for p in np.unique(parts).tolist():
            root = task_dir(self.work, "signatures", p)
            sig, have = np.load(root / "sig.npy", mmap_mode="r"), np.load(root / "rows.npy")
            sel = parts == p
            out[sel] = sig[np.searchsorted(have, rows[sel])]
        return out


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    parts = []
    for t in range(plan.bucket_tasks):
        root = task_dir(work, "buckets", t)
        offsets = np.load(root / "pair_offsets.npy")
        parts.append(np.load(root / "pairs.npy")[offsets[index]:offsets[index + 1]])
    pairs = np.unique(np.concatenate(parts), axis=0) if parts else np.zeros((0, 2), np.int64)
    pairs = pairs.reshape(-1, 2)
    starts = partition_rows(work, plan)
    if plan.minhash.verify == "exact":
        with Texts(work, starts) as texts:
            jaccard = exact_jaccards(pairs, texts.get, plan.minhash)
    else:
        rows = np.unique(pairs)
        sig = Signatures(work, plan, starts).get(rows)
        jaccard = estimated_jaccards(sig, np.searchsorted(rows, pairs))
    keep = jaccard >= plan.minhash.threshold
    edges = np.zeros(int(keep.sum()), dtype=EDGES_DTYPE)
    edges["i"], edges["j"], edges["jaccard"] = pairs[keep, 0], pairs[keep, 1], jaccard[keep]
    np.save(out / "edges.npy", edges, allow_pickle=False)
    write_json(out / "stats.json", {"candidate_pairs": len(pairs), "verified_pairs": len(edges)})
