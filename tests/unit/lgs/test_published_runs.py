"""The validation table of published runs (`bench/published_runs.py`): its rows are runs the
model takes and the runs their sources count, and the bench prints what the README and the
planner's header quote."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

from megatron_lgs.lgs.plan_run import A2A_OVERLAP_EVIDENCE, HOPPER_CAVEAT
from megatron_lgs.lgs.runspec import run_from_dict, run_to_dict
from megatron_lgs.lgs.stepmodel import predict_run

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))


def test_published_rows_cite_and_validate() -> None:
    """Every row cites its source and is a run the model takes, fits memory where its
    micro-batch is published, and the planner's Hopper header says what the rows show."""
    from published_runs import predicted, published_rows

    rows = published_rows()
    assert len(rows) >= 29 and any(r["run"].get("num_experts") for r in rows)
    assert any(r["run"].get("precision") == "fp8" for r in rows)
    for row in rows:
        assert row["source"] and row["published"] > 0
        run = run_from_dict(row["run"])
        assert run_from_dict(json.loads(json.dumps(run_to_dict(run)))) == run, row["run"]["id"]
        # These layouts ran: the memory model must not call them out of memory.
        if row.get("micro_batch") != "not published":
            assert predict_run(run).fits_memory, run.id
    # What plan_run's Hopper header says: how many H100 rows are predicted faster than they
    # ran, and their median error.
    h100 = [predicted(row)[0] / row["published"] - 1 for row in rows
            if row["run"]["gpu"] == "h100-sxm"]
    assert f"{sum(e > 0 for e in h100)} of the {len(h100)} published H100 runs" in HOPPER_CAVEAT
    assert f"a median {round(100 * statistics.median(map(abs, h100)))}%" in HOPPER_CAVEAT
    by_precision = {p: round(100 * statistics.median(
        abs(predicted(row)[0] / row["published"] - 1) for row in rows
        if row["run"]["gpu"] == "h100-sxm" and run_from_dict(row["run"]).precision == p))
        for p in ("bf16", "fp8")}
    assert f"(BF16 {by_precision['bf16']}%, FP8 {by_precision['fp8']}%)" in HOPPER_CAVEAT
    h200 = [predicted(row)[0] / row["published"] - 1 for row in rows
            if row["run"]["gpu"] == "h200"]
    assert all(e > 0 for e in h200)
    assert (f"all {len(h200)} H200 runs (2025, FP8) by {round(100 * min(h200))}-"
            f"{round(100 * max(h200))}%") in HOPPER_CAVEAT
    tuned = [predicted(row)[0] / row["published"] - 1 for row in rows
             if row["run"]["id"].startswith("mlperf41-nvidia-")]
    assert f"within {math.ceil(100 * max(map(abs, tuned)))}% of it" in HOPPER_CAVEAT


def test_bloom_row_is_the_run_its_log_counts() -> None:
    """BLOOM's log gives TFLOP/s beside the step time, counted with the recompute pass as
    Narayanan et al. count them: the row's shape, batch and GPUs must give the same figure."""
    from bloom_rows import BLOOM_STEP_S, bloom_rows

    from megatron_lgs.lgs.flops import flops_with_full_recompute

    run = run_from_dict(bloom_rows()[0]["run"])
    tflops = flops_with_full_recompute(run) / BLOOM_STEP_S / run.num_gpus / 1e12
    assert tflops == pytest.approx(149.02, abs=0.01)


def test_megatron_2020_rows_are_the_runs_their_tables_count() -> None:
    """The 2020 README's tables give TFLOP/s beside each iteration time, counted as Narayanan
    et al. count them (recompute pass included): every row's shape, batch and GPUs must give
    the same figure, to the table's rounding."""
    from megatron2020_rows import megatron2020_rows

    from megatron_lgs.lgs.flops import flops_with_full_recompute

    rows = megatron2020_rows()
    assert {run_from_dict(row["run"]).gpu for row in rows} == {"v100-32gb", "a100-40gb"}
    for row in rows:
        run = run_from_dict(row["run"])
        tflops = flops_with_full_recompute(run) / row["published"] / run.num_gpus / 1e12
        assert tflops == pytest.approx(row["tflops_published"], abs=0.1), run.id


def test_published_runs_bench_prints_its_table(capsys: pytest.CaptureFixture) -> None:
    """The validation bench runs offline and prints every row, its summary and the runs
    outside the table; its returned errors are the table's."""
    from mlperf_rows import MLPERF_FITS
    from published_runs import main, published_rows

    errors = main([])
    out = capsys.readouterr().out
    rows = published_rows()
    assert len(errors) == len(rows)
    assert all(row["run"]["id"] in out for row in rows)
    assert f"rows {len(rows)}: median |error|" in out
    for section in ("Megatron-LM README strong scaling", "fine-grained MoE",
                    "ranking layouts", "the same layouts on later releases",
                    "another trainer on Hopper"):
        assert f"## outside the table: {section}" in out
    # The README's figures of the later releases: the newest release of each row against the
    # model at its batch, in the order the README gives them (70B, 405B, 235B).
    later = re.findall(r"26\.04\.01 \d+ \(([+-][\d.]+%)\)", out)
    readme = (ROOT / "README.md").read_text()
    assert len(later) == 3 and f"{later[0]}, {later[1]}, {later[2]} where 25.11" in \
        " ".join(readme.split()), later
    assert out.count("torchtitan-llama31-8b-") == 2
    # What 128-way data parallelism added to each of the 2020 README's four replicas.
    assert len(re.findall(r"megatron20-a100-dp128-\dB .* published \+\d+  predicted \+\d+",
                          out)) == 4
    # Every row again from the fields alone, none refused, with the README's figures.
    only = re.search(r"given only the issue's fields.*\nrows (\d+): median \|error\| (\S+), "
                     r"worst (\S+),.*; (\d+) refused", out)
    assert only and (int(only.group(1)), only.group(4)) == (len(rows), "0")
    assert f"median {only.group(2)}, worst {only.group(3)}" in " ".join(readme.split())
    # Two ranking checks, the ModelZoo's MoE layouts first: the planner's Hopper header quotes
    # that one, and must say what the bench prints.
    assert out.count("pairs of layouts ordered as published") == 2
    ranked = re.search(r"pairs of layouts ordered as published: (\d+ of \d+)", out)
    assert ranked and f"orders {ranked.group(1)} pairs" in HOPPER_CAVEAT
    # ... and the EP all-to-all overlap's gain, measured by the one pair that differs by it
    # alone, which the planner's MoE answer quotes.
    gains = re.findall(r"the EP all-to-all overlap alone \(.*\): published (\S+) faster, "
                       r"predicted (\S+)\n", out)
    assert len(gains) == 1 and (f"ran {gains[0][0]} faster with it, where this model predicts "
                                f"{gains[0][1]}") in A2A_OVERLAP_EVIDENCE, gains
    # ... how much more FP8 gains over BF16 in the model than in the recipes that ran both ...
    gain = re.search(r"FP8 gain over BF16 is larger than published by a median \S+ "
                     r"\(\+([\d.]+)% to \+([\d.]+)%\)", out)
    assert gain and (f"gained {round(float(gain.group(1)))}-{round(float(gain.group(2)))}% "
                     "less from FP8") in HOPPER_CAVEAT
    # ... and the fixed cost a step that each of MLPerf's per-micro-batch fits shows the model
    # lacks (or has too much of), to 10 ms.
    gaps = re.findall(r"intercept ([+-]\d+) ms\)", out)
    assert len(gaps) == len(MLPERF_FITS)
    for gap in gaps:
        assert f"~{round(abs(int(gap)), -1)} ms a step" in HOPPER_CAVEAT


def test_planner_finds_the_tuned_layouts_it_can_express() -> None:
    """`bench/planner_vs_published.py` on two rows: the planner's search holds NVIDIA's uneven
    405B split (126 layers on 8 stages with the embedding and loss counted, 8 virtual stages)
    and returns it as the best, and the twelve virtual stages of Nemotron-4 340B's recipe,
    which it did not try until 2026-12-07 (its best was then predicted slower than the
    published layout)."""
    from planner_vs_published import compare, dense_megatron_core_rows, same_layout

    rows = {row["run"]["id"]: row for row in dense_megatron_core_rows()}
    assert rows and not any(row["run"].get("num_experts") for row in rows.values())
    (_, pub, pub_s, best, best_s), (_, pub2, pub2_s, best2, best2_s) = compare(
        [rows["mlperf50-nvidia-405b-2048"], rows["dgxc-nemotron4-340b-fp8-128"]])
    assert same_layout(pub, best) and best_s == pub_s
    assert pub2.vpp == 12 and best2_s <= pub2_s
