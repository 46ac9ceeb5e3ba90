import unicodedata

import numpy as np
import pytest
from datasketch import MinHash

from data_pipeline.minhash import (
    MinHashConfig,
    datasketch_signature,
    permutations,
    shingle_sets,
    shingles,
    signatures,
)
from data_pipeline.normalize import FilterConfig, NormalizeConfig, normalize, rejection
from data_pipeline.shingle_text import ShingleNormalization, shingle_view


def varied_texts():
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(3000)]
    vocab += ["caf\u00e9", "\u65e5\u672c\u8a9e", "na\u00efve", "\U0001f642"]
    texts = [" ".join(rng.choice(vocab, n)) for n in (1, 2, 4, 5, 6, 9, 50, 400)]
    texts += ["", " \n\t ", "a\tb\nc  d\r\ne\x0bf\x0cg h", "x" * 300]
    texts.append(" ".join(rng.choice(vocab, 20_000)))  # spans several permutation chunks
    return texts


@pytest.mark.parametrize(("num_perm", "seed"), [(128, 1), (64, 42), (7, 0)])
def test_permutations_are_datasketchs(num_perm, seed):
    a, b = permutations(num_perm, seed)
    ref_a, ref_b = MinHash(num_perm=num_perm, seed=seed).permutations
    assert a.dtype == np.uint32 and np.array_equal(a, ref_a) and np.array_equal(b, ref_b)


@pytest.mark.parametrize("hash_name", ["fast", "sha1"])
def test_signatures_equal_datasketch(hash_name):
    cfg = MinHashConfig(hash=hash_name)
    texts = varied_texts()
    ours = signatures(texts, cfg)
    assert ours.shape == (len(texts), 128) and ours.dtype == np.uint32
    for k, text in enumerate(texts):
        batch = len(text) > 10_000  # datasketch's update() loop is slow on the long one
        assert np.array_equal(ours[k], datasketch_signature(text, cfg, batch=batch)), k
    # Documents without words have datasketch's empty signature.
    assert np.all(ours[8] == 0xFFFFFFFF) and np.all(ours[9] == 0xFFFFFFFF)


def test_sha1_mode_is_datasketchs_default_minhash():
    text = varied_texts()[6]
    cfg = MinHashConfig(hash="sha1")
    sketch = MinHash(num_perm=128, seed=1)  # sha1_hash32, affine32: datasketch's defaults
    for shingle in shingles(cfg.view([text])[0], 5):  # shingles of the normalized text
        sketch.update(shingle)
    assert np.array_equal(signatures([text], cfg)[0], sketch.hashvalues)
    # Normalization off: datasketch fed the raw text's shingles.
    raw = MinHashConfig(hash="sha1", shingle=ShingleNormalization(False, False, False, False))
    sketch = MinHash(num_perm=128, seed=1)
    for shingle in shingles(text, 5):
        sketch.update(shingle)
    assert np.array_equal(signatures([text], raw)[0], sketch.hashvalues)


def test_shingle_view_folds_case_punctuation_digits_accents():
    assert shingle_view('Café, "Page" 12.5!', ShingleNormalization()) == "cafe page 00"
    assert shingle_view("Café 12", ShingleNormalization(unicode=False, digits=False)) == \
        "café 12"
    assert shingle_view("A.b", ShingleNormalization(False, False, False, False)) == "A.b"


def test_accents_are_dropped_as_their_unicode_category_says():
    text = "Tiếng Việt, Ελληνικά ἀρχή, naïve ﬁ Ｆｕｌｌ, e\u0301\u0327 İstanbul 東京"
    decomposed = unicodedata.normalize("NFKD", text)
    by_category = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    only_unicode = ShingleNormalization(False, False, False, True)
    assert shingle_view(text, only_unicode) == by_category
    assert shingle_view(text, only_unicode).startswith("Tieng Viet, Ελληνικα αρχη, naive fi Full")


def test_signature_does_not_depend_on_the_batch():
    texts = varied_texts()
    together = signatures(texts, MinHashConfig())
    for k in (0, 6, len(texts) - 1):
        assert np.array_equal(signatures([texts[k]], MinHashConfig())[0], together[k])


def test_other_ngram_and_seed():
    cfg = MinHashConfig(ngram=3, num_perm=64, seed=9, bands=8, rows=8)
    text = varied_texts()[6]
    assert np.array_equal(signatures([text], cfg)[0], datasketch_signature(text, cfg))


def test_shingle_sets_give_exact_jaccard():
    a = " ".join(f"w{i}" for i in range(100))
    b = a.replace("w50", "zz")  # breaks the 5 shingles that contain w50
    sa, sb = shingle_sets([a, b], 5)
    assert len(sa) == len(sb) == 96
    assert len(np.intersect1d(sa, sb)) == 91


@pytest.mark.parametrize("kwargs", [{"ngram": 0}, {"bands": 22}, {"threshold": 0.0},
                                    {"hash": "md5"}, {"verify": "maybe"}, {"seed": -1}])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        MinHashConfig(**kwargs)


def test_normalization():
    decomposed = "cafe\u0301  \r\nline\u00a0two   \n\n\n\n\nend\t \n"
    assert normalize(decomposed, NormalizeConfig()) == "caf\u00e9\nline two\n\nend"
    assert normalize(decomposed, NormalizeConfig(whitespace="collapse")) == \
        "caf\u00e9 line two end"
    assert normalize(decomposed, NormalizeConfig(None, "none")) == decomposed
    assert normalize("    indented code", NormalizeConfig()) == "    indented code"
    cfg = FilterConfig(min_chars=5, max_bytes=10)
    assert [rejection(t, cfg) for t in (" \n ", "abc", "abcdef", "\u00e9" * 6)] == \
        ["empty", "too_short", None, "too_long"]
    with pytest.raises(ValueError):
        NormalizeConfig(unicode_form="NFX")
