"""Batching: how a global batch splits across data-parallel ranks, and collation."""


import pytest
import torch

from data_pipeline import collate, global_batch_indices

SEQ = 10


class _Samples(torch.utils.data.Dataset):
    """Sample i: tokens i..i+SEQ-1, so every index gives a distinct sample."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tokens = torch.arange(i, i + SEQ)
        return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(SEQ),
                "position_ids": torch.arange(SEQ)}


def test_collate_stacks_and_works_with_dataloader():
    ds = _Samples()
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
    ds = _Samples()
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
