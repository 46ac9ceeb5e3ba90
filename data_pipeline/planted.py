"""A generated corpus with near-copies at known Jaccard similarity, for measuring dedup quality
(tests and ``bench/dedup.py`` use the same one).

Originals are random words (and some numbers) from a large random vocabulary, so unrelated
documents share almost no shingles. Each original gets one copy with some words replaced by
words that occur nowhere else, and a fraction of its other words edited on the surface only:
capitalized, followed by punctuation, accented, or (numbers) changed to another number. The
truth is the exact Jaccard of the two texts' shingle sets in shingle view (lowercased,
punctuation removed, digits folded, accents removed: ``shingle_text``), so recall and precision
are measured against ground truth, not against another estimator; surface edits do not move
it, while they break every raw shingle they touch.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from data_pipeline.minhash import shingles
from data_pipeline.shingle_text import ShingleNormalization, shingle_view

_LETTERS = np.array(list(string.ascii_lowercase))


@dataclass(frozen=True)
class PlantedCorpus:
    """``texts``: originals (rows 0..n-1), their copies (rows n..2n-1), then unrelated singles.
    ``pairs[k] = (original row, copy row)`` with exact shingle Jaccard ``jaccard[k]``."""

    texts: list[str]
    pairs: np.ndarray
    jaccard: np.ndarray
    ngram: int


@dataclass(frozen=True)
class DedupQuality:
    recall_085: float
    recall_080: float
    precision: float
    pairs_085: int
    pairs_080: int
    removed: int
    unrelated_merges: int

    def __str__(self) -> str:
        return (f"recall@J>=0.85 {self.recall_085:.3f} ({self.pairs_085} pairs), "
                f"recall@J>=0.80 {self.recall_080:.3f} ({self.pairs_080} pairs), "
                f"precision {self.precision:.3f} ({self.removed} removed), "
                f"unrelated merges {self.unrelated_merges}")


_DEFAULT_VIEW = ShingleNormalization()


def exact_jaccard(a: str, b: str, ngram: int, norm: ShingleNormalization = _DEFAULT_VIEW
                  ) -> float:
    sa = set(shingles(shingle_view(a, norm), ngram))
    sb = set(shingles(shingle_view(b, norm), ngram))
    return len(sa & sb) / len(sa | sb) if sa or sb else 1.0


def planted_corpus(n_pairs: int, words: int = 200, n_unrelated: int = 0, seed: int = 0,
                   ngram: int = 5, jaccard_range: tuple[float, float] = (0.4, 0.97),
                   vocabulary: int = 50_000, surface_edits: float = 0.1) -> PlantedCorpus:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 10, vocabulary)
    letters = _LETTERS[rng.integers(0, 26, int(lengths.sum()))]
    cuts = np.cumsum(lengths)[:-1]
    vocab = np.array(["".join(w) for w in np.split(letters, cuts)], dtype=object)
    numbers = rng.random(vocabulary) < 0.05  # some "words" are numbers, which digits fold
    vocab[numbers] = [str(v) for v in rng.integers(0, 10**6, int(numbers.sum())).tolist()]
    originals = [vocab[rng.integers(0, vocabulary, words)] for _ in range(n_pairs + n_unrelated)]
    shingle_count = words - ngram + 1
    copies = []
    for original in originals[:n_pairs]:
        target = rng.uniform(*jaccard_range)
        # Each isolated replacement breaks ngram shingles: J = (S - n k) / (S + n k).
        k = max(1, round(shingle_count * (1 - target) / (ngram * (1 + target))))
        copy = original.copy()
        replaced = rng.choice(words, k, replace=False)
        # 14 random letters: no other word, in shingle view, is ever one of these.
        copy[replaced] = ["".join(w) for w in _LETTERS[rng.integers(0, 26, (k, 14))]]
        others = np.setdiff1d(np.arange(words), replaced)
        edited = rng.choice(others, int(round(surface_edits * len(others))), replace=False)
        for pos, kind in zip(edited.tolist(), rng.integers(0, 4, len(edited)).tolist(),
                             strict=True):
            copy[pos] = surface_edit(str(copy[pos]), kind, rng)
        copies.append(copy)
    texts = [" ".join(w) for w in originals[:n_pairs] + copies + originals[n_pairs:]]
    pairs = np.stack([np.arange(n_pairs), np.arange(n_pairs, 2 * n_pairs)], axis=1)
    jaccard = np.array([exact_jaccard(texts[i], texts[j], ngram) for i, j in pairs.tolist()])
    return PlantedCorpus(texts, pairs, jaccard, ngram)


def surface_edit(word: str, kind: int, rng: np.random.Generator) -> str:
    """A change that shingle view undoes: number -> another number, else capitalized, followed
    by punctuation, or its first vowel accented."""
    if word.isdigit():
        return str(int(rng.integers(0, 10**6)))
    if kind == 0:
        return word.capitalize()
    if kind == 1:
        return word + ",.;:!?"[int(rng.integers(0, 6))]
    if kind == 2:
        return f'"{word.upper()}"'
    for vowel, accented in (("e", "é"), ("a", "à"), ("o", "ö"), ("u", "ü"), ("i", "î")):
        if vowel in word:
            return word.replace(vowel, accented, 1)
    return word.capitalize()


def dedup_quality(corpus: PlantedCorpus, kept: np.ndarray, threshold: float = 0.8
                  ) -> DedupQuality:
    """``kept[row]``: the row each row was merged into (itself when kept). A planted pair is
    found when both rows end up in one cluster; a removal is correct when the removed row's
    true Jaccard with the row it was merged into reaches ``threshold``."""
    found = kept[corpus.pairs[:, 0]] == kept[corpus.pairs[:, 1]]
    at_085, at_080 = corpus.jaccard >= 0.85, corpus.jaccard >= 0.80
    removed = np.flatnonzero(kept != np.arange(len(kept)))
    planted = {tuple(p) for p in corpus.pairs.tolist()}
    true_j = np.array([exact_jaccard(corpus.texts[int(kept[r])], corpus.texts[r], corpus.ngram)
                       for r in removed.tolist()])
    unrelated = sum((min(int(kept[r]), r), max(int(kept[r]), r)) not in planted
                    for r in removed.tolist())
    return DedupQuality(
        recall_085=float(found[at_085].mean()) if at_085.any() else 1.0,
        recall_080=float(found[at_080].mean()) if at_080.any() else 1.0,
        precision=float((true_j >= threshold).mean()) if len(removed) else 1.0,
        pairs_085=int(at_085.sum()), pairs_080=int(at_080.sum()),
        removed=len(removed), unrelated_merges=int(unrelated))
