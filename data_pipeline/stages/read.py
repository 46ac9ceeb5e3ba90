"""Stage 1, one task per input partition: read, normalize, filter, hash.

Writes the accepted texts (``texts.bin`` with ``offsets.npy``), each text's 16-byte content hash
(``digests.npy``, for the exact dedup stage), the source ids (``ids.json``), this partition's
counts and its first rejected samples per reason.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from data_pipeline.ingest import accept
from data_pipeline.sources import ReadOptions, read_files
from data_pipeline.stages.common import DIGEST_BYTES, Plan, write_json
from data_pipeline.stats import DomainCounts, RejectLog


def tasks(plan: Plan) -> int:
    return len(plan.partitions)


def run(plan: Plan, work: Path, index: int, out: Path) -> None:
    part = plan.partitions[index]
    cfg = plan.ingest
    opts = ReadOptions(cfg.text_field, cfg.filters.max_bytes, str(out.parent / "hf-cache"))
    counts = DomainCounts()
    rejects = RejectLog(plan.reject_samples)
    offsets = [0]
    digests = bytearray()
    ids = []
    with open(out / "texts.bin", "wb") as texts:
        records = read_files(part.domain, [(Path(p), n) for p, n in part.files], opts)
        for record, text in accept(records, cfg, counts, rejects):
            data = text.encode("utf-8")
            offsets.append(offsets[-1] + texts.write(data))
            digests += hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()
            ids.append(record.source_id)
    np.save(out / "offsets.npy", np.asarray(offsets, dtype=np.int64), allow_pickle=False)
    np.save(out / "digests.npy", np.frombuffer(bytes(digests), dtype=np.uint8)
            .reshape(-1, DIGEST_BYTES), allow_pickle=False)
    write_json(out / "ids.json", ids)
    write_json(out / "counts.json", {"documents": len(ids), "records_in": counts.records_in,
                                     "rejected": counts.rejected})
    write_json(out / "rejects.json", rejects.samples)
