"""The bucket planner: coverage, thresholds, layer boundaries, memory cap, splitting."""

from __future__ import annotations

import random

import pytest

from megatron_lgs.lgs.plan import (
    PlanConfig,
    PlanError,
    Unit,
    describe,
    layer_of,
    make_plan,
    message_columns,
)


def _random_units(rng: random.Random) -> list[Unit]:
    units = []
    for layer in range(rng.randint(1, 6)):
        for t in range(rng.randint(1, 5)):
            units.append(Unit(f"l{layer}.t{t}", f"layer {layer}", rng.randint(1, 5000),
                              rng.choice([4, 8, 16])))
    return units


def _coverage(plan) -> dict[int, list[tuple[int, int]]]:
    ranges: dict[int, list[tuple[int, int]]] = {}
    for bucket in plan.buckets:
        assert bucket.segments
        assert bucket.nbytes == sum((s.hi - s.lo) * plan.units[s.unit].unit_bytes
                                    for s in bucket.segments)
        for s in bucket.segments:
            assert s.lo < s.hi
            ranges.setdefault(s.unit, []).append((s.lo, s.hi))
    return ranges


@pytest.mark.parametrize("seed", range(200))
def test_every_unit_is_covered_exactly_once(seed):
    rng = random.Random(seed)
    units = _random_units(rng)
    config = PlanConfig(threshold_bytes=rng.randint(1, 60_000),
                        weighting=rng.choice(["none", "params", "measured"]),
                        split_large=rng.random() < 0.5)
    times = {u.layer: rng.random() for u in units}
    plan = make_plan(units, config, times)
    ranges = _coverage(plan)
    assert sorted(ranges) == list(range(len(units)))
    for i, covered in ranges.items():
        covered.sort()
        assert covered[0][0] == 0 and covered[-1][1] == units[i].units
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))
    # buckets keep backward order: unit indices never go back
    order = [(s.unit, s.lo) for b in plan.buckets for s in b.segments]
    assert order == sorted(order)
    if config.split_large:
        assert all(len(r) == 1 or units[i].nbytes > config.threshold_bytes
                   for i, r in ranges.items())
    else:
        assert all(len(r) == 1 for r in ranges.values())


@pytest.mark.parametrize("seed", range(100))
def test_memory_cap_bounds_every_bucket_or_is_a_clear_error(seed):
    rng = random.Random(seed)
    units = _random_units(rng)
    cap = rng.randint(2_000, 40_000)
    config = PlanConfig(threshold_bytes=rng.randint(1, 80_000), memory_cap_bytes=cap,
                        weighting=rng.choice(["none", "params"]), split_large=True)
    plan = make_plan(units, config)
    assert all(b.nbytes <= cap for b in plan.buckets)
    assert plan.threshold_bytes <= cap
    assert plan.tightened == (config.threshold_bytes > cap)


def test_an_unsplittable_tensor_over_the_cap_is_refused():
    units = [Unit("big", "layer 0", 1000, 4), Unit("small", "layer 0", 10, 4)]
    with pytest.raises(PlanError, match="--lgs-split-large-tensors"):
        make_plan(units, PlanConfig(threshold_bytes=100, memory_cap_bytes=2000))


def test_weighting_none_closes_at_the_threshold_params_at_layer_boundaries():
    # backward order: layer 1 (two tensors of 600 B), then layer 0 (two of 600 B)
    units = [Unit(f"{layer}.{t}", f"layer {layer}", 150, 4) for layer in (1, 0) for t in (0, 1)]
    none = make_plan(units, PlanConfig(threshold_bytes=500, weighting="none"))
    assert [len(b.segments) for b in none.buckets] == [1, 1, 1, 1]
    params = make_plan(units, PlanConfig(threshold_bytes=500, weighting="params"))
    assert [b.layers for b in params.buckets] == [("layer 1",), ("layer 0",)]
    assert [b.nbytes for b in params.buckets] == [1200, 1200]


def test_measured_weighting_gives_slow_layers_their_own_buckets():
    # Same bytes per layer (400 B); the first layer of the backward takes most of its time.
    units = [Unit(f"l{i}", f"layer {i}", 100, 4) for i in (3, 2, 1, 0)]
    times = {"layer 3": 16.0, "layer 2": 1.0, "layer 1": 1.0, "layer 0": 1.0}
    by_params = make_plan(units, PlanConfig(threshold_bytes=800, weighting="params"))
    measured = make_plan(units, PlanConfig(threshold_bytes=800, weighting="measured"), times)
    assert [b.layers for b in by_params.buckets] == [("layer 3", "layer 2"),
                                                   ("layer 1", "layer 0")]
    assert [b.layers for b in measured.buckets] == [("layer 3",),
                                                  ("layer 2", "layer 1", "layer 0")]
    # without measurements, measured falls back to bytes
    fallback = make_plan(units, PlanConfig(threshold_bytes=800, weighting="measured"))
    assert fallback.buckets == by_params.buckets


def test_split_pieces_respect_the_threshold():
    units = [Unit("embedding", "embedding", 1000, 8)]
    plan = make_plan(units, PlanConfig(threshold_bytes=1000, weighting="params",
                                       split_large=True))
    assert len(plan.buckets) == 8
    assert all(b.nbytes <= 1000 for b in plan.buckets)


def test_bad_plan_configs_are_clear_errors():
    with pytest.raises(PlanError, match="> 0"):
        PlanConfig(threshold_bytes=0)
    with pytest.raises(PlanError, match="weighting"):
        PlanConfig(threshold_bytes=1, weighting="flops")


def test_layer_names_and_table():
    assert layer_of("module.decoder.layers.11.mlp.linear_fc1.weight") == "layer 11"
    assert layer_of("embedding.word_embeddings.weight") == "embedding"
    assert layer_of("output_layer.weight") == "output"
    assert layer_of("decoder.final_layernorm.weight") == "final norm"
    units = [Unit("a", "layer 1", 10, 4), Unit("b", "layer 0", 10, 4)]
    table = describe(make_plan(units, PlanConfig(threshold_bytes=1)), "intra+inter")
    assert "2 buckets" in table and "layer 1" in table and "intra+inter" in table


@pytest.mark.parametrize("width,column_bytes,cap,block", [
    (1000, 8, 800, 1), (1000, 8, 8000, 1), (1001, 8, 800, 1), (7, 8, 1, 1),
    (100_000, 8, 2**20, 1), (5000, 8, 4096, 256), (300, 8, 100, 256)])
def test_message_columns_cover_the_bucket_in_the_fewest_even_messages(width, column_bytes,
                                                                      cap, block):
    pieces = message_columns(width, column_bytes, cap, block)
    assert pieces[0][0] == 0 and pieces[-1][1] == width
    assert all(a[1] == b[0] for a, b in zip(pieces[:-1], pieces[1:], strict=True))  # in order
    per = max(block, max(1, cap // column_bytes) // block * block)  # columns one message holds
    widths = [hi - lo for lo, hi in pieces]
    assert max(widths) <= per and len(pieces) == -(-width // per)
    assert len(set(widths[:-1])) <= 1 and widths[-1] <= widths[0]
    assert all(w % block == 0 for w in widths[:-1])
