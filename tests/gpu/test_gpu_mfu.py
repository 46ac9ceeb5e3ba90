"""On a GPU: MFU and tokens/s of a ~1.3B GPT in BF16 on the local spec, over steady-state steps,
and its peak GPU memory against the start-up memory report (figures, recorded; performance is
not asserted). Skipped where CUDA is absent. No checkpoint: it would be ~17 GB."""

from __future__ import annotations

import pytest

from megatron_lgs.metrics import gpu_peak_tflops, throughput
from tests.conftest import Run
from tests.gpu.runs import (
    GPT_1B_RUN,
    activation_bytes_estimate,
    logged_mfu,
    memory_report,
    needs_cuda,
    run_on,
    steady_state,
)

pytestmark = needs_cuda

STEPS = ["--train-iters", "12", "--log-interval", "4", "--eval-iters", "0"]


@pytest.fixture(scope="module")
def gpt_1b(data_cache) -> Run:
    """12 BF16 steps, a log line every 4: the last two intervals are the steady state."""
    return run_on("cuda", [*GPT_1B_RUN, *STEPS, "--data-cache-dir", data_cache], None,
                  timeout=300)


def parameters_of(run: Run) -> int:
    return int(run.stdout.split("parameters on this rank: ")[1].split(";")[0].replace(",", ""))


def test_mfu_of_a_1b_gpt_in_bf16_local_spec(gpt_1b, figures):
    steady = steady_state(gpt_1b)
    flops_per_token = steady["tflops_per_gpu"] * 1e12 / steady["tokens_per_second"]
    peak = gpu_peak_tflops()
    tflops, mfu = throughput(steady["tokens_per_second"], flops_per_token, 1, peak)
    params = parameters_of(gpt_1b)
    figures("parameters", params)
    figures("tokens per second (steady state)", round(steady["tokens_per_second"], 1))
    figures("model TFLOP/s per GPU (steady state)", round(tflops, 2))
    figures("peak BF16 TFLOP/s assumed", peak)
    figures("MFU (steady state)", None if mfu is None else round(mfu, 4))
    figures("MFU printed by the trainer, last interval", (logged_mfu(gpt_1b) or [None])[-1], "%")
    assert 1.2e9 < params < 1.5e9
    assert steady["tokens_per_second"] > 0 and (mfu is None or 0 < mfu < 1)


def test_peak_gpu_memory_against_the_startup_report(gpt_1b, figures):
    report = memory_report(gpt_1b)
    startup, device = report["startup"], report["device"]
    state = sum(startup.values())
    activations = activation_bytes_estimate(2048, 4, 2048, 16, 24) / 2**20
    for key, value in startup.items():
        figures(f"start-up report: {key}", value, "MiB")
    figures("peak allocated", device["max_allocated"], "MiB")
    figures("peak reserved", device["max_reserved"], "MiB")
    figures("peak allocated / start-up state", round(device["max_allocated"] / state, 3))
    # The log-interval diagnostics keep an fp32 copy of the weights for the update/parameter
    # ratio (stability.snapshot_parameters): part of the peak, not of the start-up report.
    figures("log-interval weight snapshot (fp32)", round(4 * parameters_of(gpt_1b) / 2**20, 1),
            "MiB")
    figures("Megatron activation estimate", round(activations, 1), "MiB")
    figures("(peak - state) / activation estimate",
            round((device["max_allocated"] - state) / activations, 3))
    assert report["after first step"] == startup  # the report predicted the first step's state
    assert device["max_allocated"] >= state  # the state the report counts is all resident
    assert device["max_reserved"] >= device["max_allocated"]
