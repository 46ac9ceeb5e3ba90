"""Stage 6, one task: union-find over the verified edges of every verify task, and the keep
decision's per-partition counts.

Each cluster keeps its lowest row (keep order: domain, file, line), so the decision does not
depend on how the corpus was partitioned. Memory holds the edges, i.e. the near duplicates, not
the corpus. Writes ``near.npy`` (each removed row, the row kept for it with their estimated
Jaccard, its best verified partner) and ``keep.json`` (documents kept per partition, which fixes
each partition's first global document number for the write stage).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_pipeline.dedup import best_partners, union_find
from data_pipeline.minhash import estimated_jaccard
from data_pipeline.stages import verify
from data_pipeline.stages.common import Plan, partition_rows, read_json, task_dir, write_json

NEAR_DTYPE = np.dtype([("row", "<i8"), ("kept", "<i8"), ("jaccard", "<f8"),
                       ("partner", "<i8"), ("partner_jaccard", "<f8")])


def tasks(plan: Plan) -> int:
    return 1


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    starts = partition_rows(work, plan)
    parts = [np.load(task_dir(work, "verify", t) / "edges.npy") for t in range(
        plan.verify_tasks if plan.near_dedup else 0)]
    edges = np.concatenate(parts) if parts else np.zeros(0, verify.EDGES_DTYPE)
    edges = np.sort(edges, order=["i", "j"])
    pairs = np.stack([edges["i"], edges["j"]], axis=1).astype(np.int64)
    nodes = np.unique(pairs)
    local = np.searchsorted(nodes, pairs)
    root = nodes[union_find(len(nodes), local)] if len(nodes) else nodes
    removed = root != nodes
    near = np.zeros(int(removed.sum()), dtype=NEAR_DTYPE)
    near["row"], near["kept"] = nodes[removed], root[removed]
    if len(near):
        rows, best, best_j = best_partners(pairs, edges["jaccard"])
        at = np.searchsorted(rows, near["row"])
        near["partner"], near["partner_jaccard"] = best[at], best_j[at]
        sigs = verify.Signatures(work, plan, starts)
        near["jaccard"] = estimated_jaccard(sigs.get(near["row"]), sigs.get(near["kept"]))
    np.save(out / "near.npy", near, allow_pickle=False)

    n_parts = len(plan.partitions)
    dropped = np.bincount(np.searchsorted(starts, near["row"], side="right") - 1,
                          minlength=n_parts)
    exact_dups = np.zeros(n_parts, dtype=np.int64)
    for t in range(plan.exact_tasks):
        rows = np.load(task_dir(work, "exact", t) / "dups.npy")["row"]
        exact_dups += np.bincount(np.searchsorted(starts, rows, side="right") - 1,
                                  minlength=n_parts)
    stats = [read_json(task_dir(work, "verify", t) / "stats.json")
             for t in range(plan.verify_tasks if plan.near_dedup else 0)]
    write_json(out / "keep.json", {
        "kept": (np.diff(starts) - exact_dups - dropped[:n_parts]).tolist(),
        "exact_duplicates": exact_dups.tolist(), "near_duplicates": dropped[:n_parts].tolist(),
        "candidate_pairs": sum(s["candidate_pairs"] for s in stats),
        "verified_pairs": sum(s["verified_pairs"] for s in stats),
    })


def kept_rows(lo: int, hi: int, dups: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Local rows of the partition of global rows [lo, hi) that survive exact dedup (its
    ``exact.duplicates_in``) and near dedup (``near.npy``), in keep order."""
    a, b = np.searchsorted(near["row"], [lo, hi])
    return np.setdiff1d(np.arange(hi - lo),
                        np.concatenate([dups["row"], near["row"][a:b]]) - lo)
