"""`predict` on many generated runs: a malformed one is a RunError naming a field, never another
exception, and a well-formed one gets finite, non-negative terms that sum to its step and
keeps the model's invariants."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from megatron_lgs.lgs.runspec import RunError, run_from_dict
from megatron_lgs.lgs.stepmodel import predict_run

DENSE = {"id": "d", "gpu": "h100-sxm", "num_gpus": 64, "gpus_per_node": 8, "num_layers": 32,
         "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000, "seq_length": 4096,
         "tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 256, "swiglu": True,
         "distributed_optimizer": True}
MOE = {**DENSE, "id": "m", "num_experts": 8, "moe_topk": 2, "ep": 4}
ODD_VALUES = [0, -1, 1, 3, 7, 1.5, "x", "full", "fp8", True, [], ["moe"], {}, 10**9, 2**40,
              float("nan"), float("inf")]
FIELDS = sorted(set(DENSE) | {"num_experts", "moe_topk", "ep", "cp", "dp", "vpp", "zero",
                              "etp", "moe_ffn_hidden", "head_dim", "recompute",
                              "recompute_num_layers", "recompute_modules", "precision",
                              "moe_dispatcher", "fp8_recipe", "nic_gbit_per_gpu",
                              "decoder_first_pipeline_num_layers", "moe_a2a_overlap",
                              "position_embedding", "dropout", "sequence_parallel"})


def _malformed(rng: random.Random) -> dict[str, Any]:
    run = dict(rng.choice([DENSE, MOE]))
    for _ in range(rng.randint(1, 3)):
        run[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    return run


def _well_formed(rng: random.Random) -> dict[str, Any]:
    tp, pp, cp, dp = (rng.choice(v) for v in ([1, 2, 4, 8], [1, 2, 4], [1, 1, 2], [1, 2, 8]))
    heads = rng.choice([16, 32, 64])
    run = {"id": "w", "gpu": rng.choice(["v100-32gb", "a100-80gb", "h100-sxm", "h800", "h200"]),
           "num_gpus": tp * pp * cp * dp, "gpus_per_node": rng.choice([None, 4, 8]),
           "num_layers": rng.choice([2, 8, 24, 32, 126]), "hidden": heads * 128, "heads": heads,
           "kv_heads": rng.choice([heads, 8]), "vocab": rng.choice([32000, 50257]),
           "seq_length": rng.choice([2048, 4096]), "tp": tp, "pp": pp, "cp": cp,
           "vpp": rng.choice([None, 2]), "micro_batch": rng.choice([1, 2]),
           "recompute": rng.choice(["none", "selective", "full"]),
           "precision": rng.choice(["bf16", "fp8", "fp16"]), "swiglu": rng.random() < 0.5,
           "distributed_optimizer": rng.random() < 0.7, "tp_comm_overlap": rng.random() < 0.3,
           "position_embedding": rng.choice(["rope", "learned_absolute"])}
    run["global_batch"] = dp * run["micro_batch"] * rng.choice([1, 8, 16])
    if rng.random() < 0.4:
        run.update(num_experts=rng.choice([8, 64]), moe_topk=rng.choice([1, 2, 8]),
                   ep=rng.choice([1, 2, 8]), moe_dispatcher=rng.choice(["alltoall", "flex"]),
                   moe_a2a_overlap=rng.random() < 0.3)
    return run


def _sharded_or_slow(rng: random.Random) -> dict[str, Any]:
    """A well-formed run, half of them ZeRO 2 or 3 (pure data parallelism), on a network of
    25-100 Gb/s or the profile's own: where the invariants below once failed."""
    run = _well_formed(rng)
    if rng.random() < 0.5:
        run.update(pp=1, vpp=None, zero=rng.choice([2, 3]), distributed_optimizer=True,
                   num_gpus=run["num_gpus"] // run["pp"])
    run["nic_gbit_per_gpu"] = rng.choice([None, 100, 25])
    return run


@pytest.mark.parametrize("seed", range(3))
def test_a_malformed_run_is_a_run_error(seed: int) -> None:
    rng = random.Random(seed)
    refused = 0
    for _ in range(300):
        try:
            predict_run(run_from_dict(_malformed(rng)))
        except RunError as e:
            refused += 1
            assert e.field and "\n" not in str(e)
    assert refused > 200  # the generator mostly breaks runs; a test of nothing otherwise


def test_a_well_formed_run_has_finite_terms_that_sum_to_its_step() -> None:
    rng = random.Random(0)
    predicted = 0
    for _ in range(400):
        try:
            run = run_from_dict(_well_formed(rng))
        except RunError:
            continue
        est = predict_run(run)
        predicted += 1
        terms = est.breakdown.values()
        assert all(math.isfinite(v) and v >= 0 for v in terms), est.breakdown
        assert sum(terms) == pytest.approx(est.step_time_s, rel=1e-9)
        assert est.step_time_s > 0 and est.mfu > 0 and est.memory.peak_bytes > 0
    assert predicted >= 30


def test_recompute_never_makes_a_generated_run_faster() -> None:
    """The issue's invariant over generated runs, ZeRO 2 and 3 and slow networks among them
    (where it once failed: a ZeRO-3 backward's gathers and reduce-scatters had each hidden
    behind all of the recomputed compute). The tolerance: the interleaved schedule's exposed
    pipeline sends and the gradient sync after them both shrink as the recompute lengthens a
    backward, by up to ~2e-5 of a step."""
    rng = random.Random(1)
    compared = 0
    for _ in range(150):
        run = _sharded_or_slow(rng)
        steps = []
        for mode in ("none", "selective", "full"):
            try:
                steps.append(predict_run(run_from_dict({**run, "recompute": mode})).step_time_s)
            except RunError:
                break
        if len(steps) == 3:
            compared += 1
            assert steps[0] <= steps[1] * (1 + 1e-4) and steps[0] <= steps[2] * (1 + 1e-4), \
                (run, steps)
    assert compared >= 40


def test_more_micro_batches_never_make_a_sample_dearer() -> None:
    """Doubling the global batch at one layout never raises the time a sample takes: every
    per-step cost spreads over more samples and every per-micro-batch cost stays. It once
    failed on network-bound ZeRO 2/3, whose last micro-batch's reduction hid behind the links'
    own gathers (a step of one micro-batch came out one gather short)."""
    rng = random.Random(2)
    compared = 0
    for _ in range(150):
        run = _sharded_or_slow(rng)
        try:
            one = predict_run(run_from_dict(run)).step_time_s
            two = predict_run(run_from_dict({**run, "global_batch": 2 * run["global_batch"]}))
        except RunError:
            continue
        compared += 1
        assert two.step_time_s / 2 <= one * (1 + 1e-9), run
    assert compared >= 40
