"""Stage 4, one task per range of (band, bucket key) hashes: LSH candidate pairs.

Task t reads its slice of every partition's band keys, so it sees every document of its buckets
and nothing else. Inside a bucket (rows ascending) each row is paired with the next
``BUCKET_WINDOW`` rows, as ``dedup.candidate_pairs`` does. Pairs are written sorted by
(verify task, i, j) with ``pair_offsets.npy`` giving each verify task's slice, so a pair found in
several bands or bucket tasks is verified once, by the task that owns it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_pipeline.dedup import BUCKET_WINDOW
from data_pipeline.stages import signatures
from data_pipeline.stages.common import Plan, mix64, task_dir


def tasks(plan: Plan) -> int:
    return plan.bucket_tasks if plan.near_dedup else 0


def pair_owner(pairs: np.ndarray, n_tasks: int) -> np.ndarray:
    mixed = mix64(mix64(pairs[:, 0]) ^ pairs[:, 1].astype(np.uint64))
    return (mixed % np.uint64(n_tasks)).astype(np.int64)


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    parts = []
    for p in range(len(plan.partitions)):
        root = task_dir(work, "signatures", p)
        offsets = np.load(root / "band_offsets.npy")
        bands = np.load(root / "bands.npy", mmap_mode="r") if offsets[-1] else None
        if bands is not None and offsets[index + 1] > offsets[index]:
            parts.append(np.array(bands[offsets[index]:offsets[index + 1]]))
    entries = np.concatenate(parts) if parts else np.zeros(0, signatures.BANDS_DTYPE)
    entries = entries[np.lexsort((entries["row"], entries["key"], entries["band"]))]
    band, key, row = entries["band"], entries["key"], entries["row"]
    found = []
    for gap in range(1, BUCKET_WINDOW + 1):
        same = (band[:-gap] == band[gap:]) & (key[:-gap] == key[gap:])
        if not same.any():
            break  # no run longer than gap, so none longer than gap + 1 either
        found.append(np.stack([row[:-gap][same], row[gap:][same]], axis=1))
    pairs = np.unique(np.concatenate(found), axis=0) if found else np.zeros((0, 2), np.int64)
    owners = pair_owner(pairs, plan.verify_tasks)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], owners))
    np.save(out / "pairs.npy", pairs[order].astype(np.int64), allow_pickle=False)
    np.save(out / "pair_offsets.npy",
            np.searchsorted(owners[order], np.arange(plan.verify_tasks + 1)).astype(np.int64),
            allow_pickle=False)
