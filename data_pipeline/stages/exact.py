"""Stage 2, one task per range of content hashes: exact duplicates.

Task t reads the digests of every partition (16 bytes per document) but keeps only those whose
hash falls in its range, so it holds 1/T of them. The first copy in keep order is kept; the
others are written as (row, first row) pairs, sorted by row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_pipeline.stages.common import Plan, mix64, partition_rows, task_dir

DUPS_DTYPE = np.dtype([("row", "<i8"), ("first", "<i8")])


def tasks(plan: Plan) -> int:
    return plan.exact_tasks


def owner(digests: np.ndarray, n_tasks: int) -> np.ndarray:
    head = np.ascontiguousarray(digests[:, :8]).view("<u8").ravel()
    return (mix64(head) % np.uint64(n_tasks)).astype(np.int64)


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    starts = partition_rows(work, plan)
    keys, rows = [], []
    for p in range(len(plan.partitions)):
        digests = np.load(task_dir(work, "read", p) / "digests.npy")
        mine = np.flatnonzero(owner(digests, plan.exact_tasks) == index)
        keys.append(digests[mine])
        rows.append(mine + starts[p])
    key = np.concatenate(keys) if keys else np.zeros((0, 16), np.uint8)
    row = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    dups = np.zeros(0, dtype=DUPS_DTYPE)
    if len(row):
        # Group equal digests (two 64-bit halves), rows ascending inside a group.
        halves = np.ascontiguousarray(key).view("<u8")
        order = np.lexsort((row, halves[:, 1], halves[:, 0]))
        halves, row = halves[order], row[order]
        new_group = np.concatenate(([True], np.any(halves[1:] != halves[:-1], axis=1)))
        first = row[np.flatnonzero(new_group)][np.cumsum(new_group) - 1]
        is_dup = ~new_group
        dups = np.zeros(int(is_dup.sum()), dtype=DUPS_DTYPE)
        dups["row"], dups["first"] = row[is_dup], first[is_dup]
        dups.sort(order="row")
    np.save(out / "dups.npy", dups, allow_pickle=False)


def duplicates_in(work: Path, plan: Plan, lo: int, hi: int) -> np.ndarray:
    """Every exact duplicate (row, first) with lo <= row < hi, sorted by row."""
    parts = []
    for t in range(plan.exact_tasks):
        dups = np.load(task_dir(work, "exact", t) / "dups.npy")
        a, b = np.searchsorted(dups["row"], [lo, hi])
        parts.append(dups[a:b])
    found = np.concatenate(parts) if parts else np.zeros(0, dtype=DUPS_DTYPE)
    return np.sort(found, order="row")
