import time

import numpy as np
import pytest

from data_pipeline.dedup import BUCKET_WINDOW, candidate_pairs, near_duplicates
from data_pipeline.minhash import MinHashConfig, signatures
from data_pipeline.planted import dedup_quality, planted_corpus
from tests.conftest import report


@pytest.fixture(scope="module")
def planted():
    corpus = planted_corpus(n_pairs=1500, words=200, n_unrelated=500, seed=0)
    return corpus, signatures(corpus.texts, MinHashConfig())



def run(planted, verify):
    corpus, sig = planted
    cfg = MinHashConfig(verify=verify)
    start = time.perf_counter()
    found = near_duplicates(sig, cfg, lambda rows: [corpus.texts[r] for r in rows])
    quality = dedup_quality(corpus, found.kept)
    report(f"dedup, {verify} verification, {cfg.bands}x{cfg.rows} bands, threshold 0.8: {quality} "
           f"[{found.candidate_pairs} candidates, {time.perf_counter() - start:.2f}s]")
    return corpus, found, quality


def test_planted_corpus_spans_the_jaccard_range(planted):
    corpus, _ = planted
    assert corpus.jaccard.min() < 0.45 and corpus.jaccard.max() > 0.95
    assert (corpus.jaccard >= 0.8).sum() > 400


def test_recall_and_precision_exact_verification(planted):
    _, found, quality = run(planted, "exact")
    assert quality.recall_085 >= 0.95
    assert quality.recall_080 >= 0.88
    assert quality.precision >= 0.9
    assert quality.unrelated_merges == 0
    # The kept row of each cluster is its lowest row: the originals, never the copies.
    assert np.all(found.kept <= np.arange(len(found.kept)))


def test_recall_and_precision_estimated_verification(planted):
    # Estimator noise (sd ~0.035 at J=0.8) costs recall just above the threshold; the
    # issue's bar at J >= 0.8 is met by exact verification, the default.
    _, _, quality = run(planted, "estimated")
    assert quality.recall_085 >= 0.95
    assert quality.recall_080 >= 0.85
    assert quality.precision >= 0.9
    assert quality.unrelated_merges == 0


def test_unrelated_documents_are_never_merged():
    corpus = planted_corpus(n_pairs=0, words=60, n_unrelated=3000, seed=5)
    sig = signatures(corpus.texts, MinHashConfig())
    found = near_duplicates(sig, MinHashConfig(), lambda rows: [corpus.texts[r] for r in rows])
    assert len(found.removed) == 0


def test_report_fields_point_at_the_kept_row(planted):
    corpus, found, _ = run(planted, "exact")
    removed = found.removed
    assert np.all(found.partner[removed] >= 0) and np.all(found.partner_jaccard[removed] >= 0.8)
    assert np.all((found.jaccard_to_kept[removed] > 0.6) & (found.jaccard_to_kept[removed] <= 1))
    kept = np.setdiff1d(np.arange(len(found.kept)), removed)
    assert np.all(found.partner[kept] == -1) and np.all(found.jaccard_to_kept[kept] == 1.0)


def test_large_bucket_is_linear_and_still_one_cluster():
    # 5000 documents with one signature (boilerplate): all pairs would be 12.5M.
    n = 5000
    sig = np.tile(signatures(["the same boilerplate text " * 20], MinHashConfig()), (n, 1))
    pairs = candidate_pairs(sig, MinHashConfig())
    assert len(pairs) <= n * BUCKET_WINDOW
    found = near_duplicates(sig, MinHashConfig(verify="estimated"))
    assert np.all(found.kept == 0)
