import itertools
import random

import numpy as np
import pytest
import torch

from data_pipeline import PackedDataset, collate, global_batch_indices

SEQ = 10


def arange_dataset(n_tokens=1000, seed=7, name="train", **kwargs):
    return PackedDataset(np.arange(n_tokens, dtype=np.int32), SEQ, seed, name, **kwargs)


def window_start(sample):
    # With an arange stream a window's first token is its start offset.
    return int(sample["tokens"][0])


def test_num_windows_drops_incomplete_tail():
    assert len(arange_dataset(20)) == 1  # 11 tokens needed per window
    assert len(arange_dataset(21)) == 2  # windows [0, 11) and [10, 21)
    assert len(arange_dataset(30)) == 2
    assert len(arange_dataset(1000)) == 99
    with pytest.raises(ValueError, match="cannot fill"):
        arange_dataset(SEQ)


def test_sample_shapes_dtypes_and_shift():
    stream = np.random.default_rng(0).integers(0, 500, 777, dtype=np.int32)
    ds = PackedDataset(stream, SEQ, 1, "x")
    expected = sorted(
        tuple(stream[k * SEQ : k * SEQ + SEQ + 1]) for k in range(len(ds))
    )
    seen = []
    for i in range(len(ds)):
        s = ds[i]
        assert s["tokens"].dtype == torch.int64 and s["tokens"].shape == (SEQ,)
        assert s["labels"].dtype == torch.int64 and s["labels"].shape == (SEQ,)
        assert s["loss_mask"].dtype == torch.float32 and torch.all(s["loss_mask"] == 1)
        assert torch.equal(s["position_ids"], torch.arange(SEQ))
        assert torch.equal(s["labels"][:-1], s["tokens"][1:])
        seen.append(tuple(s["tokens"].tolist() + [int(s["labels"][-1])]))
    assert sorted(seen) == expected


def test_windows_tile_stream_overlapping_by_one_token():
    ds = arange_dataset(1000)
    windows = sorted((ds[i] for i in range(len(ds))), key=window_start)
    assert [window_start(w) for w in windows] == list(range(0, 99 * SEQ, SEQ))
    for w in windows:
        start = window_start(w)
        assert torch.equal(w["tokens"], torch.arange(start, start + SEQ))
        assert torch.equal(w["labels"], torch.arange(start + 1, start + SEQ + 1))
    for prev, nxt in itertools.pairwise(windows):
        assert int(prev["labels"][-1]) == int(nxt["tokens"][0])


def test_each_epoch_is_a_permutation_and_epochs_differ():
    ds = arange_dataset(1000)
    n = len(ds)
    orders = [[window_start(ds[e * n + j]) for j in range(n)] for e in range(3)]
    for order in orders:
        assert sorted(order) == list(range(0, n * SEQ, SEQ))
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert orders[0] != sorted(orders[0])  # actually shuffled


def test_sample_is_pure_function_of_index():
    indices = [0, 5, 98, 99, 1000, 3, 250, 99, 0, 10**6]
    first = arange_dataset()
    second = arange_dataset()
    # Different access order (and epoch jumps) must not change any sample.
    a = {i: first[i] for i in indices}
    b = {i: second[i] for i in reversed(indices)}
    for i in indices:
        for key in a[i]:
            assert torch.equal(a[i][key], b[i][key])


def test_seed_and_name_select_the_order():
    def order(ds):
        return [window_start(ds[j]) for j in range(len(ds))]

    base = order(arange_dataset(seed=7, name="train"))
    assert order(arange_dataset(seed=7, name="train")) == base
    assert order(arange_dataset(seed=8, name="train")) != base
    assert order(arange_dataset(seed=7, name="valid")) != base


def test_global_rng_state_untouched():
    torch_state = torch.get_rng_state()
    np_state = np.random.get_state()
    py_state = random.getstate()
    ds = arange_dataset()
    for i in (0, 1, 150, 300, 12345):
        ds[i]
    assert torch.equal(torch.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert after[2:] == np_state[2:]
    assert random.getstate() == py_state


def test_index_types():
    ds = arange_dataset()
    assert torch.equal(ds[np.int64(3)]["tokens"], ds[3]["tokens"])
    with pytest.raises(IndexError):
        ds[-1]
    for bad in (1.0, "3", None, True):
        with pytest.raises(TypeError):
            ds[bad]


def test_samples_do_not_alias_stream():
    ds = arange_dataset()
    s = ds[0]
    s["tokens"].fill_(-1)
    s["labels"].fill_(-1)
    assert torch.equal(
        ds[0]["tokens"], torch.arange(window_start(ds[0]), window_start(ds[0]) + SEQ)
    )
    assert ds.tokens.min() == 0


def test_fingerprint():
    base = arange_dataset().fingerprint
    assert arange_dataset().fingerprint == base
    assert arange_dataset(seed=8).fingerprint != base
    assert arange_dataset(name="valid").fingerprint != base
    assert (
        PackedDataset(np.arange(1000, dtype=np.int64), SEQ, 7, "train").fingerprint
        == base
    )
    assert (
        PackedDataset(np.arange(1000, dtype=np.int32), SEQ + 1, 7, "train").fingerprint
        != base
    )
    changed = np.arange(1000, dtype=np.int32)
    changed[500] = 0
    assert PackedDataset(changed, SEQ, 7, "train").fingerprint != base
    assert arange_dataset(stream_id="k:train").fingerprint != base
    assert (
        arange_dataset(stream_id="k:train").fingerprint
        == arange_dataset(stream_id="k:train").fingerprint
    )


def test_constructor_validation():
    with pytest.raises(TypeError):
        PackedDataset(np.zeros((10, 10), dtype=np.int32), SEQ, 0, "x")
    with pytest.raises(TypeError):
        PackedDataset(np.zeros(100, dtype=np.float32), SEQ, 0, "x")
    with pytest.raises(ValueError):
        PackedDataset(np.zeros(100, dtype=np.int32), 0, 0, "x")
    with pytest.raises(ValueError):
        PackedDataset(np.zeros(100, dtype=np.int32), SEQ, -1, "x")


def test_collate_stacks_and_works_with_dataloader():
    ds = arange_dataset()
    batch = collate([ds[i] for i in range(4)])
    assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids"}
    assert (
        batch["tokens"].shape == (4, SEQ) and batch["loss_mask"].dtype == torch.float32
    )
    assert torch.equal(batch["labels"][2], ds[2]["labels"])
    indices = global_batch_indices(8, 8, 1, 2)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, sampler=indices, collate_fn=collate
    )
    (from_loader,) = list(loader)
    assert torch.equal(
        from_loader["tokens"], collate([ds[i] for i in indices])["tokens"]
    )


def test_collate_rejects_bad_input():
    with pytest.raises(ValueError):
        collate([])
    ds = arange_dataset()
    partial = {k: v for k, v in ds[1].items() if k != "loss_mask"}
    with pytest.raises(ValueError):
        collate([ds[0], partial])


@pytest.mark.parametrize("dp_size", [1, 2, 4, 8])
def test_global_batch_indices_partition(dp_size):
    gbs, start = 16, 48
    per_rank = [global_batch_indices(start, gbs, r, dp_size) for r in range(dp_size)]
    flat = [i for rank in per_rank for i in rank]
    assert sorted(flat) == list(range(start, start + gbs))
    assert len(set(flat)) == len(flat)
    for r, rank in enumerate(per_rank):
        assert rank == sorted(rank)
        assert len(rank) == gbs // dp_size
        assert all(i % dp_size == r for i in rank)


def test_global_batch_indices_values():
    assert global_batch_indices(0, 4, 0, 2) == [0, 2]
    assert global_batch_indices(4, 4, 1, 2) == [5, 7]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, 6, 0, 4), ValueError),  # gbs not divisible by dp_size
        ((2, 8, 0, 4), ValueError),  # start not a multiple of dp_size
        ((0, 8, 4, 4), ValueError),  # rank out of range
        ((0, 8, -1, 4), ValueError),
        ((0, 8, 0, 0), ValueError),
        ((0, 0, 0, 1), ValueError),
        ((-4, 8, 0, 4), ValueError),
        ((0.0, 8, 0, 4), TypeError),
        ((0, 8, True, 4), TypeError),
    ],
)
def test_global_batch_indices_rejects_bad_args(args, error):
    with pytest.raises(error):
        global_batch_indices(*args)
