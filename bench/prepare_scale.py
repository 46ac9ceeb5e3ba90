"""Staged ``prepare`` at scale: a corpus of real offline text with planted near-duplicates
(bench/planted_text.py), prepared with 1 and 2 workers, and the same for a corpus 4x smaller.

Prints documents/s, MB/s, peak RSS per task (the largest, per stage) and of the whole run
(this process and its workers, sampled every 0.2 s), recall and precision on the planted pairs,
then the two targets: peak task RSS of the large corpus within 25% of the small one's, and 2
workers >= 1.7x one worker's rate. Runs are interleaved (small 1, small 2, large 1, large 2)
so load changes hit both worker counts alike.

    python bench/prepare_scale.py --size-mb 2048        # the issue's size
    python bench/prepare_scale.py --size-mb 64          # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planted_text import Planted, line_pool, quality, write_corpus  # noqa: E402

from data_pipeline.executors.local import LocalExecutor  # noqa: E402
from data_pipeline.prepare import DEDUP_REPORT, PrepareConfig, prepare  # noqa: E402
from data_pipeline.sources import DomainSource  # noqa: E402


class PeakRss(threading.Thread):
    """Largest sum of RSS over this process and its descendants."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._done.wait(0.2):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def run_once(planted: Planted, src: Path, out: Path, workers: int, args) -> dict:
    executor = LocalExecutor(workers)
    sampler = PeakRss()
    sampler.start()
    start = time.perf_counter()
    prepare(PrepareConfig(sources=(DomainSource("web", str(src)),), output=out,
                          vocab_size=args.vocab_size, vocab_sample_bytes=args.vocab_sample_mb << 20,
                          partition_bytes=args.partition_mb << 20, progress=False), executor)
    seconds = time.perf_counter() - start
    whole = sampler.stop()
    per_stage = {stage: max((s["peak_rss_mb"] for s in stats if s), default=0.0)
                 for stage, stats in executor.stats.items()}
    removed = {json.loads(line)["removed"] for line in
               (out / DEDUP_REPORT).read_text(encoding="utf-8").splitlines()}
    fingerprint = json.loads((out / "manifest.json").read_text())["fingerprint"]
    shutil.rmtree(out)
    return {"workers": workers, "seconds": seconds, "docs_s": planted.documents / seconds,
            "mb_s": planted.bytes / 2**20 / seconds, "task_rss_mb": max(per_stage.values()),
            "stage_rss_mb": per_stage, "run_rss_mb": whole / 2**20,
            "fingerprint": fingerprint, **quality(planted, removed)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=2048, help="the large corpus")
    p.add_argument("--partition-mb", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--vocab-sample-mb", type=int, default=PrepareConfig.vocab_sample_bytes >> 20)
    p.add_argument("--dir", type=Path, default=None, help="where corpora go (default: tmp)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="prepare-scale-", dir=args.dir))
    try:
        pool = line_pool()
        corpora = {}
        for name, size in (("small", args.size_mb // 4), ("large", args.size_mb)):
            t = time.perf_counter()
            corpora[name] = write_corpus(root / name, size << 20, seed=1, pool=pool,
                                         file_bytes=min(32, max(1, size // 16)) << 20)
            c = corpora[name]
            print(f"{name}: {c.bytes / 2**20:.0f} MB, {c.documents} documents, "
                  f"{len(c.pairs)} planted pairs, {len(c.files)} files "
                  f"(made in {time.perf_counter() - t:.0f} s)", flush=True)
        results = {}
        for name in ("small", "large"):
            for workers in (int(w) for w in args.workers.split(",")):
                r = run_once(corpora[name], root / name, root / f"out-{name}-{workers}",
                             workers, args)
                results[name, workers] = r
                print(f"{name} workers={workers}: {r['seconds']:.1f} s, {r['docs_s']:.0f} docs/s, "
                      f"{r['mb_s']:.2f} MB/s, peak RSS per task {r['task_rss_mb']:.0f} MB "
                      f"(by stage: " + ", ".join(f"{s} {v:.0f}" for s, v in
                                                  r["stage_rss_mb"].items()) +
                      f"), whole run {r['run_rss_mb']:.0f} MB; recall@0.8 {r['recall@0.8']:.3f} "
                      f"recall@0.85 {r['recall@0.85']:.3f} precision {r['precision']:.3f} "
                      f"({r['removed']} removed); fingerprint {r['fingerprint'][:12]}",
                      flush=True)
        w = sorted({k[1] for k in results})
        for name in ("small", "large"):
            same = len({results[name, k]["fingerprint"] for k in w}) == 1
            print(f"{name}: same output for workers {w}: {same}")
        growth = results["large", w[0]]["task_rss_mb"] / results["small", w[0]]["task_rss_mb"]
        print(f"peak task RSS large/small (4x corpus): {growth:.2f} (target <= 1.25)")
        if len(w) > 1:
            for name in ("small", "large"):
                ratio = results[name, w[-1]]["docs_s"] / results[name, w[0]]["docs_s"]
                print(f"{name}: {w[-1]} workers / {w[0]}: {ratio:.2f}x (target >= 1.7x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
