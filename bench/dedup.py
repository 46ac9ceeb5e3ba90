"""MinHash signature throughput: datasketch's per-shingle ``update()`` loop vs its
``update_batch`` vs our numpy path batched across documents (its exact-sha1 mode and its default
fast-hash mode), on the same generated corpus in the same run, with each method's dedup quality
(recall of planted near-copies by true Jaccard, precision) under the same LSH (the default bands).

    python bench/dedup.py [--pairs 600 --unrelated 300 --words 200]

Prints docs/s (median of repeated runs after a warm-up) and the ratio to ``update()``
(target for the default path: >= 40x).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_pipeline.dedup import near_duplicates  # noqa: E402
from data_pipeline.minhash import MinHashConfig, datasketch_signature, signatures  # noqa: E402
from data_pipeline.planted import PlantedCorpus, dedup_quality, planted_corpus  # noqa: E402


def timed(fn: Callable[[list[str]], np.ndarray], texts: list[str]) -> tuple[np.ndarray, float]:
    """Signatures and the median seconds of up to 5 runs (one when a run takes over 1 s),
    after a warm-up on a slice (numpy buffers, power tables), the same for every method."""
    fn(texts[:50])
    seconds = []
    while len(seconds) < 5 and sum(seconds) < 1.0:
        start = time.perf_counter()
        out = fn(texts)
        seconds.append(time.perf_counter() - start)
    return out, float(np.median(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=600, help="originals with one near-copy")
    parser.add_argument("--unrelated", type=int, default=300)
    parser.add_argument("--words", type=int, default=200, help="words per document")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    corpus: PlantedCorpus = planted_corpus(args.pairs, args.words, args.unrelated, args.seed)
    texts = corpus.texts
    sha1, fast = MinHashConfig(hash="sha1"), MinHashConfig()
    methods: dict[str, Callable[[list[str]], np.ndarray]] = {
        "datasketch update() per shingle": lambda docs: np.stack(
            [datasketch_signature(t, sha1) for t in docs]),
        "datasketch update_batch": lambda docs: np.stack(
            [datasketch_signature(t, sha1, batch=True) for t in docs]),
        "ours, sha1 (== datasketch)": lambda docs: signatures(docs, sha1),
        "ours, fast hash (default)": lambda docs: signatures(docs, fast),
    }
    print(f"{len(texts)} documents x {args.words} words, {len(corpus.pairs)} planted pairs "
          f"(true Jaccard {corpus.jaccard.min():.2f}..{corpus.jaccard.max():.2f}), "
          f"128 permutations, {fast.bands} x {fast.rows} bands, threshold 0.8")
    header = (f"{'method':34} {'docs/s':>9} {'vs update()':>11}   "
              f"{'verify':9} {'R@.85':>6} {'R@.80':>6} {'prec':>6}")
    print(header)
    print("-" * len(header))
    baseline = None
    results = {}
    for name, run in methods.items():
        sig, seconds = timed(run, texts)
        results[name] = sig
        rate = len(texts) / seconds
        baseline = baseline or rate
        for k, verify in enumerate(("exact", "estimated")):
            cfg = MinHashConfig(verify=verify)
            found = near_duplicates(sig, cfg, lambda rows: [texts[r] for r in rows])
            q = dedup_quality(corpus, found.kept)
            lead = (f"{name:34} {rate:9.0f} {rate / baseline:10.1f}x" if k == 0
                    else " " * 56)
            print(f"{lead}   {verify:9} {q.recall_085:6.3f} {q.recall_080:6.3f} "
                  f"{q.precision:6.3f}")
    same = np.array_equal(results["ours, sha1 (== datasketch)"],
                          results["datasketch update() per shingle"])
    print(f"ours (sha1) signatures equal datasketch's: {same}")


if __name__ == "__main__":
    main()
