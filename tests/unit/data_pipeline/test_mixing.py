import json

import numpy as np
import pytest
import torch

from data_pipeline import collate
from data_pipeline.loader import LoaderConfig, blend_domains
from data_pipeline.mixing import MixingConfig, MixingSchedule, apply_floor, update_weights

DOMAINS = ["web", "code", "books"]
WINDOW = 96  # samples per window: e.g. 12 global batches of 8


def test_higher_loss_gets_more_weight_within_bounds():
    cfg = MixingConfig(eta=2.0, floor=0.1, smoothing=0.5)
    w = np.array([0.5, 0.3, 0.2])
    history = [w]
    for _ in range(30):  # "books" is made artificially hard
        w = update_weights(w, [2.0, 2.1, 4.0], cfg)
        history.append(w)
        assert w.sum() == pytest.approx(1.0) and np.all(w >= cfg.floor - 1e-12)
    books = [h[2] for h in history]
    assert books == sorted(books) and books[1] > books[0]
    assert books[-1] == pytest.approx(1.0 - 2 * cfg.floor)  # the most the floors allow
    assert np.allclose(history[-1][:2], cfg.floor)


def test_update_rule_details():
    w = [0.5, 0.3, 0.2]
    assert np.allclose(update_weights(w, [9.0, 1.0, 5.0], MixingConfig(eta=0.0, floor=0.0)), w)
    # Equal losses change nothing; a constant shift of all losses changes nothing.
    cfg = MixingConfig(floor=0.0)
    assert np.allclose(update_weights(w, [3.0, 3.0, 3.0], cfg), w)
    assert np.allclose(update_weights(w, [1.0, 2.0, 3.0], cfg),
                       update_weights(w, [11.0, 12.0, 13.0], cfg))
    # Smoothing keeps that share of the previous weights.
    sharp = update_weights(w, [1.0, 2.0, 9.0], MixingConfig(eta=5.0, floor=0.0, smoothing=0.0))
    half = update_weights(w, [1.0, 2.0, 9.0], MixingConfig(eta=5.0, floor=0.0, smoothing=0.5))
    assert np.allclose(half, 0.5 * np.asarray(w) + 0.5 * sharp)
    # Excess loss: domains already at their reference get no push.
    excess = MixingConfig(floor=0.0, smoothing=0.0, excess_loss=True)
    out = update_weights(w, [1.0, 1.0, 3.0], excess, reference=[2.0, 0.5, 2.0])
    assert out[2] > w[2] and out[1] > out[0] * (0.3 / 0.5)
    with pytest.raises(ValueError, match="reference"):
        update_weights(w, [1.0, 1.0, 1.0], excess)
    with pytest.raises(ValueError):
        update_weights(w, [1.0, float("nan"), 1.0], cfg)
    with pytest.raises(ValueError):
        update_weights(w, [1.0, 2.0], cfg)


def test_floor_projection():
    out = apply_floor(np.array([0.97, 0.02, 0.01]), 0.05)
    assert np.allclose(out, [0.9, 0.05, 0.05])
    assert np.allclose(apply_floor(np.array([0.5, 0.5]), 0.1), [0.5, 0.5])
    with pytest.raises(ValueError, match="exceeds 1"):
        apply_floor(np.array([0.5, 0.5]), 0.6)


def run_dynamic(prepared, schedule, cfg, stop, losses_for):
    """Consume samples [0, stop) window by window, updating weights at window ends, the way a
    trainer would; returns the samples."""
    ds = blend_domains([prepared.output], schedule, LoaderConfig(32))
    tokens = []
    start = schedule.windows[-1][0]
    while start < stop:
        end = min(start + WINDOW, stop)
        tokens.append(collate(ds.__getitems__(list(range(start, end))))["tokens"])
        if end == start + WINDOW:
            schedule.update(end, losses_for(end), cfg)
        start = end
    return torch.cat(tokens)


def losses_for(sample):
    # "books" is hard; the others drift down, as validation losses do.
    decay = np.exp(-sample / 1000)
    return {"web": 2.0 + decay, "code": 1.5 + decay, "books": 4.0}


def test_resume_mid_window_reproduces_weights_and_samples(prepared):
    cfg = MixingConfig(eta=1.0, floor=0.05, smoothing=0.3)
    full_schedule = MixingSchedule(DOMAINS, {"web": 0.6, "code": 0.25, "books": 0.15})
    full = run_dynamic(prepared, full_schedule, cfg, 5 * WINDOW, losses_for)

    # Interrupted mid-window 3: the checkpoint holds the consumed count and the schedule.
    consumed = 3 * WINDOW + 40
    first = MixingSchedule(DOMAINS, {"web": 0.6, "code": 0.25, "books": 0.15})
    head = run_dynamic(prepared, first, cfg, consumed, losses_for)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint

    resumed = MixingSchedule(DOMAINS, [1.0, 1.0, 1.0])
    resumed.load_state_dict(state)
    assert resumed.windows == full_schedule.windows[:4]
    ds = blend_domains([prepared.output], resumed, LoaderConfig(32))
    rest = collate(ds.__getitems__(list(range(consumed, 4 * WINDOW))))["tokens"]
    resumed.update(4 * WINDOW, losses_for(4 * WINDOW), cfg)
    tail = run_dynamic(prepared, resumed, cfg, 5 * WINDOW, losses_for)
    assert torch.equal(torch.cat([head, rest, tail]), full)
    assert resumed.windows == full_schedule.windows
    books = [w[2] for _, w in full_schedule.windows]
    print(f"\nbooks weight per window: {[round(b, 3) for b in books]}")
    assert books == sorted(books) and books[-1] > 0.3


def test_weights_hold_within_each_window(prepared):
    schedule = MixingSchedule(DOMAINS, [0.6, 0.25, 0.15])
    schedule.append(1000, [0.2, 0.2, 0.6])
    ds = blend_domains([prepared.output], schedule, LoaderConfig(32))
    components, _ = ds.locate(np.arange(2000))
    assert np.bincount(components[:1000], minlength=3).tolist() == [600, 250, 150]
    assert np.bincount(components[1000:], minlength=3).tolist() == [200, 200, 600]
    assert schedule.weights_at(999) == pytest.approx((0.6, 0.25, 0.15))
    assert schedule.weights_at(1000) == pytest.approx((0.2, 0.2, 0.6))


def test_schedule_validation():
    schedule = MixingSchedule(DOMAINS, [1, 1, 1])
    schedule.append(10, [1, 2, 3])
    with pytest.raises(ValueError, match="after sample 10"):
        schedule.append(10, [1, 1, 1])
    with pytest.raises(ValueError, match="exactly the domains"):
        schedule.append(20, {"web": 1.0})
    with pytest.raises(ValueError, match="domains"):
        MixingSchedule(["a", "b"], [1, 1]).load_state_dict(schedule.state_dict())
    with pytest.raises(ValueError, match="increase"):
        schedule.load_state_dict({"domains": DOMAINS, "windows": [[0, [1, 1, 1]], [0, [1, 1, 1]]]})
    with pytest.raises(ValueError):
        MixingConfig(floor=1.0)
