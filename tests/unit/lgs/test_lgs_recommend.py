"""Start-up threshold recommendation from the simulator, for numbers and for trainer configs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.launch_configs import load_config
from megatron_lgs.lgs import Thresholds, Workload, custom, memory_wall, predict_step
from megatron_lgs.lgs.recommend import (
    DEFAULT_PROFILE,
    profile_for_device,
    recommend,
    recommend_for_config,
    recommend_thresholds,
    workload_for,
    workload_for_config,
)
from megatron_lgs.lgs.simulate import GRID_MB, PRESETS
from megatron_lgs.lgs.timeline import MB

# The simulator's 100B dense preset (GPT-3 shape on 128 A100, TP8 PP4 DP4), as trainer numbers.
GPT_100B = dict(num_layers=80, hidden_size=10240, ffn_hidden_size=40960,
                num_attention_heads=80, vocab_size=51200, seq_length=2048, num_experts=None,
                moe_router_topk=2, tp=8, pp=4, dp=4, ep=1, gpus_per_node=8,
                micro_batch_size=1, num_micro_batches=128)


def test_numbers_map_to_the_simulator_preset():
    model, lay = PRESETS["gpt-100b"]
    w = workload_for(**GPT_100B)
    assert w.model == model and replace(w.layout, etp=1) == lay
    assert w.layout.etp == 8  # megatron-core: expert TP defaults to TP
    assert w.hw.name == DEFAULT_PROFILE


@pytest.mark.parametrize("profile", ["a100-hdr", "h100-ndr", "h200-ndr"])
def test_recommendation_is_the_fastest_fitting_grid_point(profile):
    r = recommend_thresholds(**GPT_100B, profile=profile)
    w = workload_for(**GPT_100B, profile=profile)
    wall = memory_wall(w.model, w.layout, w.hw.memory_bytes)
    assert r.profile == profile and r.fits_memory
    assert r.intra_mb in GRID_MB and r.inter_mb in GRID_MB
    assert r.prediction.thresholds == Thresholds(r.intra_mb * MB, r.inter_mb * MB)
    for i in GRID_MB:
        for e in GRID_MB:
            p = predict_step(w, Thresholds(i * MB, e * MB))
            if i * MB <= wall.largest_threshold_bytes:
                assert r.prediction.step_time_s <= p.step_time_s + 1e-9
    print(f"\n{profile}: recommended intra {r.intra_mb} MB, inter {r.inter_mb} MB "
          f"(predicted step {r.prediction.step_time_s:.3f} s)")


def test_memory_wall_caps_the_recommendation():
    model, lay = PRESETS["gpt-100b"]
    # Buckets closing at the threshold: with "params" every threshold under a layer's 630 MB
    # is the same plan, and ties go to the smallest.
    roomy = Workload(model, lay, custom(300, 24, memory_GB=80), weighting="none")
    wall = memory_wall(model, lay, 80e9)
    # Memory leaving 2 x 40 MB of staging room beside states and activations (10% reserved).
    tight_bytes = (wall.states_bytes + wall.activation_bytes + 2 * 40 * MB) / 0.9
    assert memory_wall(model, lay, tight_bytes).largest_threshold_bytes == pytest.approx(40 * MB)
    tight = recommend(Workload(model, lay, custom(300, 24, memory_GB=tight_bytes / 1e9),
                               weighting="none"))
    assert recommend(roomy).intra_mb > 32
    assert tight.fits_memory and tight.intra_mb <= 32
    starved = recommend(Workload(model, lay, custom(300, 24, memory_GB=10)))
    assert not starved.fits_memory and starved.intra_mb == min(GRID_MB)


def test_trainer_config_maps_to_the_same_numbers():
    cfg = load_config("gpt-10b")  # 16 GPUs: TP4 PP2 DP2, global batch 512, micro-batch 1
    # Megatron pads the 32000-token vocabulary to a multiple of 128 x TP4 = 512: 32256.
    by_hand = recommend_thresholds(
        num_layers=40, hidden_size=5120, ffn_hidden_size=13824, num_attention_heads=40,
        vocab_size=32256, seq_length=4096, num_experts=None, moe_router_topk=2, tp=4, pp=2,
        dp=2, ep=1, gpus_per_node=8, micro_batch_size=1, num_micro_batches=256,
        num_query_groups=8, swiglu=True, untie_embeddings=True, distributed_optimizer=True)
    assert recommend_for_config(cfg, gpus_per_node=8) == by_hand


def test_moe_config_maps_experts_and_expert_parallelism():
    cfg = load_config("gpt-100b-moe")
    lay = workload_for_config(cfg, 8).layout
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.etp, lay.expert_dp) == (2, 8, 8, 8, 2, 1)


@pytest.mark.parametrize("device, profile", [
    ("NVIDIA H100 80GB HBM3", "h100-ndr"), ("NVIDIA H200", "h200-ndr"),
    ("NVIDIA A100-SXM4-80GB", "a100-hdr"), ("Tesla V100-SXM2-32GB", DEFAULT_PROFILE),
    (None, DEFAULT_PROFILE)])
def test_profile_for_device(device, profile):
    assert profile_for_device(device) == profile


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown hardware profile 'tpu'"):
        recommend_thresholds(**GPT_100B, profile="tpu")
