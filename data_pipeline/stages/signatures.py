"""Stage 3, one task per partition: MinHash signatures and their LSH band keys.

Exact duplicates are skipped (their first copy stands for them). Writes ``sig.npy`` (one row per
remaining document), ``rows.npy`` (their global rows) and the band keys already partitioned for
the bucket stage: ``bands.npy`` sorted by (bucket task, band, key, row) with ``band_offsets.npy``
giving each bucket task's slice, so a bucket task reads only its own slice of every partition.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_pipeline.dedup import band_keys
from data_pipeline.minhash import signatures
from data_pipeline.stages import exact
from data_pipeline.stages.common import Plan, mix64, partition_rows, task_dir

BANDS_DTYPE = np.dtype([("band", "<i4"), ("key", "<u8"), ("row", "<i8")])
_BATCH_BYTES = 4 << 20


def tasks(plan: Plan) -> int:
    return len(plan.partitions) if plan.near_dedup else 0


def bucket_owner(band: int, keys: np.ndarray, n_tasks: int) -> np.ndarray:
    return (mix64(keys ^ np.uint64(band * 0x9E3779B97F4A7C15 % (1 << 64))) %
            np.uint64(n_tasks)).astype(np.int64)


def _batches(offsets: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """Local rows cut into runs of about _BATCH_BYTES of text."""
    sizes = offsets[rows + 1] - offsets[rows]
    cut = np.searchsorted(np.cumsum(sizes), np.arange(_BATCH_BYTES, int(sizes.sum()) + 1,
                                                      _BATCH_BYTES), side="right")
    return [b for b in np.split(rows, np.unique(cut[(cut > 0) & (cut < len(rows))])) if len(b)]


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    starts = partition_rows(work, plan)
    lo, hi = int(starts[index]), int(starts[index + 1])
    root = task_dir(work, "read", index)
    offsets = np.load(root / "offsets.npy")
    dup_rows = exact.duplicates_in(work, plan, lo, hi)["row"] - lo
    local = np.setdiff1d(np.arange(hi - lo), dup_rows)
    cfg = plan.minhash
    sig = np.empty((len(local), cfg.num_perm), dtype=np.uint32)
    if len(local):
        data = np.memmap(root / "texts.bin", dtype=np.uint8, mode="r")
        done = 0
        for batch in _batches(offsets, local):
            texts = [bytes(data[offsets[r]:offsets[r + 1]]).decode("utf-8")
                     for r in batch.tolist()]
            sig[done:done + len(batch)] = signatures(texts, cfg)
            done += len(batch)
    rows = local.astype(np.int64) + lo
    np.save(out / "sig.npy", sig, allow_pickle=False)
    np.save(out / "rows.npy", rows, allow_pickle=False)
    entries = np.zeros(len(rows) * cfg.bands, dtype=BANDS_DTYPE)
    owners = np.zeros(len(entries), dtype=np.int64)
    for band in range(cfg.bands):
        keys = band_keys(sig, band, cfg.rows)
        part = slice(band * len(rows), (band + 1) * len(rows))
        entries["band"][part], entries["key"][part], entries["row"][part] = band, keys, rows
        owners[part] = bucket_owner(band, keys, plan.bucket_tasks)
    order = np.lexsort((entries["row"], entries["key"], entries["band"], owners))
    np.save(out / "bands.npy", entries[order], allow_pickle=False)
    np.save(out / "band_offsets.npy",
            np.searchsorted(owners[order], np.arange(plan.bucket_tasks + 1)).astype(np.int64),
            allow_pickle=False)
