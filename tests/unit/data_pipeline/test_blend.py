import numpy as np
import pytest

from data_pipeline.blend import WindowedBlend, counts_before, cycle, greedy, quantize


def prefix_counts(components, n_components):
    one_hot = np.zeros((len(components), n_components), dtype=np.int64)
    one_hot[np.arange(len(components)), components] = 1
    return np.cumsum(one_hot, axis=0)


def test_megatron_weights_within_one_sample_at_every_prefix():
    weights = np.array([0.6, 0.25, 0.15])
    n = 100_000
    components, index = WindowedBlend([(0, weights)]).lookup(np.arange(n))
    counts = prefix_counts(components, 3)
    target = np.arange(1, n + 1)[:, None] * weights
    worst = np.abs(counts - target).max()
    print(f"\nmax |count - w*n| over 100k prefixes: {worst:.3f}")
    assert worst < 1.0
    # Each component's samples are numbered 0, 1, 2, ... in blend order: none reused or skipped.
    for d in range(3):
        assert np.array_equal(index[components == d], np.arange(counts[-1, d]))


def test_greedy_is_megatrons_rule():
    weights = np.array([0.6, 0.25, 0.15])
    counts = np.zeros(3)
    expected = []
    for i in range(200):
        d = int(np.argmax(weights * (i + 1) - counts))
        expected.append(d)
        counts[d] += 1
    assert WindowedBlend([(0, weights)]).lookup(np.arange(200))[0].tolist() == expected


@pytest.mark.parametrize("seed", range(5))
def test_random_weights_stay_within_one_and_cycle(seed):
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.ones(int(rng.integers(2, 8))))
    shares = quantize(weights)
    c = cycle(tuple(shares.tolist()))
    counts = prefix_counts(c.component, len(shares))
    assert np.array_equal(counts[-1], shares)  # back to zero error after one period
    target = np.arange(1, c.period + 1)[:, None] * shares / shares.sum()
    assert np.abs(counts - target).max() < 1.0
    assert np.abs(shares / shares.sum() - weights).max() <= 1e-4


def test_quantize():
    assert quantize([0.6, 0.25, 0.15]).tolist() == [12, 5, 3]
    assert quantize([3, 1]).tolist() == [3, 1]
    assert quantize([1, 0, 1]).tolist() == [1, 0, 1]
    assert quantize([1 / 3, 1 / 3, 1 / 3], 10).tolist() == [4, 3, 3]
    for bad in ([], [0, 0], [-1, 2], [float("nan"), 1]):
        with pytest.raises(ValueError):
            quantize(bad)


def test_windows_continue_each_components_counter():
    windows = [(0, [0.5, 0.5]), (1001, [0.9, 0.1]), (1777, [0.2, 0.8])]
    blend = WindowedBlend(windows)
    components, index = blend.lookup(np.arange(5000))
    for d in range(2):
        assert np.array_equal(index[components == d], np.arange((components == d).sum()))
    # Within each window the blend restarts from zero error with that window's weights.
    for (start, w), end in zip(windows, [1001, 1777, 5000], strict=True):
        part = prefix_counts(components[start:end], 2)
        target = np.arange(1, end - start + 1)[:, None] * np.asarray(w)
        assert np.abs(part - target).max() < 1.0
    # Order of lookups does not matter: pure function of the position.
    shuffled = np.random.default_rng(0).permutation(5000)
    c2, i2 = blend.lookup(shuffled)
    assert np.array_equal(c2, components[shuffled]) and np.array_equal(i2, index[shuffled])


def test_counts_before_matches_the_sequence():
    shares = (7, 2, 5)
    seq = greedy(shares, 3 * 14 + 9)
    assert counts_before(shares, len(seq)).tolist() == np.bincount(seq, minlength=3).tolist()


def test_window_validation():
    with pytest.raises(ValueError, match="start at sample 0"):
        WindowedBlend([(5, [1.0])])
    with pytest.raises(ValueError, match="increase"):
        WindowedBlend([(0, [1.0, 1.0]), (10, [1.0, 2.0]), (10, [2.0, 1.0])])
    with pytest.raises(ValueError, match="one weight per component"):
        WindowedBlend([(0, [1.0, 1.0]), (10, [1.0])])
