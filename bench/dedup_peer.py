"""Our MinHash dedup beside datatrove's on one planted corpus (bench/planted_text.py), in the same
run and with the same number of workers.

datatrove runs its four standard stages (MinhashDedupSignature, MinhashDedupBuckets,
MinhashDedupCluster, MinhashDedupFilter) with its default FineWeb configuration (word 5-grams,
14 buckets x 8 hashes) under its LocalPipelineExecutor. It is a bench requirement, not a
runtime one: this script installs ``datatrove[processing]==0.10.1``, orjson and spacy (its
default word tokenizer) into its own venv (``--venv``, default /work/venvs/datatrove) on first
use and runs datatrove there. Ours is ``prepare`` with the same workers; its time is printed
for the dedup stages (read .. clusters: the same work as datatrove's four stages) and whole
(with BPE training, tokenization and shards).

Prints recall at J >= 0.8 and 0.85, precision and documents/s of both, and the targets:
recall >= datatrove's at equal or better precision, throughput >= 3x.

    python bench/dedup_peer.py --size-mb 64 --workers 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planted_text import Planted, line_pool, quality, write_corpus  # noqa: E402

from data_pipeline.executors.local import LocalExecutor  # noqa: E402
from data_pipeline.prepare import DEDUP_REPORT, PrepareConfig, prepare  # noqa: E402
from data_pipeline.sources import DomainSource  # noqa: E402

DATATROVE = "datatrove[processing]==0.10.1"
DEDUP_STAGES = ("read", "exact", "signatures", "buckets", "verify", "clusters")

# Runs inside the datatrove venv: argv = input dir, work dir, workers, tasks.
_PEER = r'''
import json, sys, time
from pathlib import Path
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets,
                                              MinhashDedupCluster, MinhashDedupFilter)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers.jsonl import JsonlWriter

src, work, workers, tasks = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = MinhashConfig()  # FineWeb's defaults: 5-grams, 14 buckets x 8 hashes
start = time.perf_counter()
LocalPipelineExecutor(pipeline=[JsonlReader(src),
                                MinhashDedupSignature(output_folder=str(work / "sigs"),
                                                      config=cfg)],
                      tasks=tasks, workers=workers, logging_dir=str(work / "logs/1")).run()
LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(input_folder=str(work / "sigs"),
                                                    output_folder=str(work / "buckets"),
                                                    config=cfg)],
                      tasks=cfg.num_buckets, workers=workers,
                      logging_dir=str(work / "logs/2")).run()
LocalPipelineExecutor(pipeline=[MinhashDedupCluster(input_folder=str(work / "buckets"),
                                                    output_folder=str(work / "remove"),
                                                    config=cfg)],
                      tasks=1, logging_dir=str(work / "logs/3")).run()
LocalPipelineExecutor(pipeline=[JsonlReader(src),
                                MinhashDedupFilter(input_folder=str(work / "remove"),
                                                   exclusion_writer=JsonlWriter(
                                                       str(work / "removed"))),
                                JsonlWriter(str(work / "kept"))],
                      tasks=tasks, workers=workers, logging_dir=str(work / "logs/4")).run()
seconds = time.perf_counter() - start
import gzip
removed = []
for path in sorted((work / "removed").glob("*")):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        removed += [json.loads(line)["id"] for line in f]
print(json.dumps({"seconds": seconds, "removed": removed}))
'''


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import datatrove, orjson, spacy; "
             "from importlib.metadata import version; assert version('datatrove') == '0.10.1'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing {DATATROVE}, orjson, spacy into {venv} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", DATATROVE, "orjson", "spacy"],
                   check=True)
    return python


class _TimedStages(LocalExecutor):
    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.seconds: dict[str, float] = {}

    def run_stage(self, work: Path, stage: str, n_tasks: int) -> None:
        start = time.perf_counter()
        super().run_stage(work, stage, n_tasks)
        self.seconds[stage] = time.perf_counter() - start


def ours(planted: Planted, src: Path, out: Path, workers: int, partition_mb: int) -> dict:
    executor = _TimedStages(workers)
    start = time.perf_counter()
    prepare(PrepareConfig(sources=(DomainSource("web", str(src)),), output=out,
                          vocab_size=1024, partition_bytes=partition_mb << 20,
                          progress=False), executor)
    whole = time.perf_counter() - start
    removed = {json.loads(line)["removed"] for line in
               (out / DEDUP_REPORT).read_text(encoding="utf-8").splitlines()}
    shutil.rmtree(out)
    dedup = sum(executor.seconds.get(s, 0.0) for s in DEDUP_STAGES)
    return {"seconds": dedup, "whole_seconds": whole, **quality(planted, removed)}


def peer(python: Path, planted: Planted, src: Path, work: Path, workers: int) -> dict:
    proc = subprocess.run([str(python), "-c", _PEER, str(src), str(work), str(workers),
                           str(len(planted.files))], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"datatrove failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": result["seconds"], **quality(planted, set(result["removed"]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="interleaved runs of each; medians")
    p.add_argument("--venv", type=Path, default=Path("/work/venvs/datatrove"))
    args = p.parse_args()
    python = ensure_venv(args.venv)
    root = Path(tempfile.mkdtemp(prefix="dedup-peer-"))
    try:
        planted = write_corpus(root / "src", args.size_mb << 20, seed=2, pool=line_pool(),
                               file_bytes=max(1, args.size_mb // 8) << 20)
        print(f"corpus: {planted.bytes / 2**20:.0f} MB, {planted.documents} documents, "
              f"{len(planted.pairs)} planted pairs, {len(planted.files)} files; "
              f"{args.workers} workers", flush=True)
        runs: dict[str, list[dict]] = {"ours": [], "datatrove": []}
        for k in range(args.repeats):
            runs["ours"].append(ours(planted, root / "src", root / f"ours-{k}", args.workers,
                                     max(1, args.size_mb // 8)))
            runs["datatrove"].append(peer(python, planted, root / "src", root / f"dt-{k}",
                                          args.workers))
        med = {}
        for name, rs in runs.items():
            r = dict(rs[0])
            r["seconds"] = sorted(x["seconds"] for x in rs)[len(rs) // 2]
            r["docs_s"] = planted.documents / r["seconds"]
            med[name] = r
            extra = f", whole prepare {r['whole_seconds']:.1f} s" if "whole_seconds" in r else ""
            print(f"{name:9s}: recall@0.8 {r['recall@0.8']:.3f} recall@0.85 "
                  f"{r['recall@0.85']:.3f} precision {r['precision']:.3f} ({r['removed']} "
                  f"removed), {r['seconds']:.1f} s, {r['docs_s']:.0f} docs/s{extra}")
        o, d = med["ours"], med["datatrove"]
        print(f"recall@0.8 ours - datatrove: {o['recall@0.8'] - d['recall@0.8']:+.3f} "
              f"(target >= 0 at precision >= datatrove's: {o['precision']:.3f} vs "
              f"{d['precision']:.3f}); throughput ours / datatrove: "
              f"{o['docs_s'] / d['docs_s']:.2f}x (target >= 3x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
