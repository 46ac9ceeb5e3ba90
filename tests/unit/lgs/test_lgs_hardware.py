"""Hardware profile files (save/load, bad files), the probe's fit, and the cost model's wiring
of `--lgs-hardware PATH.json` / `measured`."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.lgs.calibrate import fit_link, probe_overlap
from megatron_lgs.lgs.calibrate import main as calibrate_main
from megatron_lgs.lgs.costmodel import HardwareProfile, Link, reduce_scatter_time
from megatron_lgs.lgs.hardware import (
    ProfileError,
    load_measurements,
    load_profile,
    profile_to_dict,
    resolve_profile,
    save_profile,
)
from megatron_lgs.lgs.recommend import recommend_for_config, workload_for_config
from megatron_lgs.lgs.timeline import Thresholds, predict_step
from tests.conftest import TINY_GPT

MEASURED = HardwareProfile(
    name="measured", intra=Link(20e-6, 2.5e9), inter=Link(400e-6, 0.06e9), gpus_per_node=2,
    peak_flops=7.5e9, memory_bytes=6e9, source="calibration probe on 2 node(s) x 2 rank(s)",
    efficiency=1.0, overlap=0.25)


def test_save_load_round_trip_keeps_every_constant_and_the_samples(tmp_path):
    samples = {"inter_samples": [[65536, 0.004], [4194304, 0.2]], "backward_s_per_layer": 0.03}
    path = save_profile(MEASURED, tmp_path / "sub" / "cluster.json", samples)
    assert load_profile(path) == MEASURED
    assert load_measurements(path) == samples
    assert resolve_profile(str(path), "a100-hdr") == MEASURED
    assert resolve_profile(None, "a100-hdr").name == "a100-hdr"


def _write(tmp_path, content) -> str:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _broken(**change) -> dict:
    d = profile_to_dict(MEASURED)
    for key, value in change.items():
        if "." in key:
            outer, inner = key.split(".")
            d[outer][inner] = value
        else:
            d[key] = value
    return d


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON (line 1"),
    ({"name": "x"}, "not a hardware profile"),
    (_broken(version=7), "profile version 7"),
    (_broken(**{"inter.bandwidth_Bps": -1.0}), "bandwidth_Bps must be finite and > 0"),
    (_broken(**{"intra.alpha_s": "fast"}), "'alpha_s' must be a finite number"),
    (_broken(inter=None), "'inter' must be an object"),
    (_broken(gpus_per_node=1.5), "'gpus_per_node' must be an integer"),
    (_broken(efficiency=2.0), "efficiency must be in (0, 1]"),
    (_broken(overlap=-0.5), "overlap must be in [0, 1]"),
])
def test_bad_profile_file_is_one_line_naming_the_file(tmp_path, content, message):
    path = _write(tmp_path, content)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    text = str(err.value)
    assert text.startswith(path) and message in text and "\n" not in text


def test_bad_profile_flag_exits_2_in_one_line(tmp_path, capsys):
    missing = str(tmp_path / "nope.json")
    bad = _write(tmp_path, _broken(**{"inter.bandwidth_Bps": 0}))
    for spec, message in ((missing, "cannot read hardware profile"),
                          (bad, "bandwidth_Bps must be finite and > 0"),
                          ("h300-xdr", "is not one of a100-hdr, h100-ndr, h200-ndr, 'measured'")):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--lgs", "--lgs-thresholds", "auto", "--lgs-hardware", spec], 1)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--lgs-hardware" in err[0] and message in err[0], err
    with pytest.raises(SystemExit):
        parse_args(["--lgs", "--lgs-hardware", "measured",
                    "--pipeline-model-parallel-size", "2"], 2)
    assert "probes a one-stage model" in capsys.readouterr().err


def test_fit_recovers_latency_and_bandwidth_of_the_ring_formula():
    link, p = Link(150e-6, 0.11e9), 2
    sizes = [64 << 10, 512 << 10, 4 << 20]
    fit = fit_link([(n, reduce_scatter_time(n, p, link)) for n in sizes], p)
    assert fit.alpha_s == pytest.approx(link.alpha_s, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(link.bandwidth_Bps, rel=1e-6)
    # A mid-size message under a token bucket's burst (faster than the line): the latency
    # still comes from the smallest message and the bandwidth from the largest. (A
    # least-squares line through all three, as measured on the emulated cluster's tbf link,
    # had a negative intercept: zero latency.)
    burst = [(n, reduce_scatter_time(n, p, link) * (0.5 if n == sizes[1] else 1.0))
             for n in sizes]
    fit = fit_link(burst, p)
    assert fit.alpha_s == pytest.approx(link.alpha_s, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(link.bandwidth_Bps, rel=1e-6)
    # Noise that makes the intercept negative: zero latency, slope through the origin.
    noisy = fit_link([(1 << 20, 0.001), (8 << 20, 0.05)], 4)
    assert noisy.alpha_s == 0.0 and noisy.bandwidth_Bps > 0
    with pytest.raises(ValueError, match=">= 2 sizes"):
        fit_link([(1 << 20, 0.01)], 2)


def test_profile_file_drives_the_cost_model(tmp_path):
    path = str(save_profile(MEASURED, tmp_path / "p.json"))
    cfg = parse_args([*TINY_GPT, "--lgs", "--lgs-thresholds", "auto", "--lgs-hardware", path,
                      "--use-distributed-optimizer", "--global-batch-size", "16"], 4)
    w = workload_for_config(cfg, 2, path)
    # A measured profile's rate is what the probe reached: no data-sheet efficiency on top.
    assert w.hw == MEASURED and w.flop_rate == MEASURED.peak_flops
    assert recommend_for_config(cfg, 2, path) == recommend_for_config(cfg, 2, MEASURED)
    # Halving the inter-node bandwidth slows the predicted step: the file's numbers are used.
    slow = HardwareProfile(**{**MEASURED.__dict__, "inter": Link(400e-6, 0.03e9)})
    th = Thresholds(1 << 20, 1 << 20)
    assert (predict_step(workload_for_config(cfg, 2, slow), th).step_time_s
            > predict_step(w, th).step_time_s)


def test_overlap_below_one_charges_the_communication_beside_the_backward(tmp_path):
    cfg = parse_args([*TINY_GPT, "--lgs", "--use-distributed-optimizer",
                      "--global-batch-size", "16"], 4)
    th = Thresholds(1 << 16, 1 << 16)  # small buckets: most communication runs beside compute
    free, shared = (predict_step(workload_for_config(
        cfg, 2, HardwareProfile(**{**MEASURED.__dict__, "overlap": o})), th) for o in (1.0, 0.0))
    stage = free.stages[0]
    beside = sum(max(0.0, min(b.end_s, stage.backward_end_s) - max(b.start_s, stage.ops[0].start_s))
                 for b in stage.buckets)
    assert beside > 0
    assert shared.step_time_s == pytest.approx(free.step_time_s + beside)


def test_intra_overlap_charges_the_intra_node_hops_apart_from_the_inter_node_ones():
    cfg = parse_args([*TINY_GPT, "--lgs", "--use-distributed-optimizer",
                      "--global-batch-size", "16"], 4)
    th = Thresholds(1 << 16, 1 << 16)

    def step(overlap: float, intra_overlap: float | None) -> float:
        hw = HardwareProfile(**{**MEASURED.__dict__, "overlap": overlap,
                                "intra_overlap": intra_overlap})
        return predict_step(workload_for_config(cfg, 2, hw), th).step_time_s

    free = step(1.0, None)
    intra_only, inter_only, both = step(1.0, 0.0), step(0.0, 1.0), step(0.0, None)
    assert intra_only > free and inter_only > free
    # Each level's hops are charged once, by their own level's overlap.
    assert both - free == pytest.approx((intra_only - free) + (inter_only - free))
    assert step(0.25, 0.25) == step(0.25, None)


def test_profile_keeps_the_intra_node_overlap_and_rejects_one_out_of_range(tmp_path):
    hw = HardwareProfile(**{**MEASURED.__dict__, "intra_overlap": 0.75})
    assert load_profile(save_profile(hw, tmp_path / "p.json")) == hw
    with pytest.raises(ProfileError, match="intra_overlap must be in"):
        load_profile(_write(tmp_path, _broken(intra_overlap=1.5)))


def _spinner(seconds: float):
    """Busy Python of a fixed amount of work that takes about `seconds` alone: it holds the
    GIL, so two of them on two threads take as long as both in turn."""
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        n += 1

    def spin() -> None:
        for _ in range(n):
            time.perf_counter()
    return spin


def test_overlap_probe_tells_work_that_overlaps_from_work_that_competes(one_rank_group):
    # 0.2 s sleeps: a woken thread's wait for a core on a loaded machine must stay small
    # against them (with 0.05 s this failed 1 run in 4 beside the suite's process tests).
    # The spinners' median of 5: one repetition that a foreign process slowed cannot decide it.
    assert probe_overlap(lambda: time.sleep(0.2), lambda: time.sleep(0.2), 3) > 0.8
    assert probe_overlap(_spinner(0.05), _spinner(0.05), 5) < 0.3
    # The setup hook runs on the communication thread, before the communication, every time.
    seen: list[int] = []
    probe_overlap(lambda: None, lambda: seen.append(-1), 2,
                  comm_thread_setup=lambda: seen.append(threading.get_ident()))
    assert len(seen) == 8 and seen[1::2] == [-1] * 4
    assert threading.get_ident() not in seen


@pytest.mark.parametrize("argv,said", [
    (["--out", "/proc/no/such/profile.json"], "No such file"),
    (["--out", "."], "is a directory"),
    (["--out", "/proc/version"], "--out /proc/version: "),
    (["--hidden-size"], "--out PROFILE.json is required"),
    (["--out", "{tmp}/p.json", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_calibrate_refuses_bad_input_before_measuring(argv: list[str], said: str, tmp_path: Path,
                                                      capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        calibrate_main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and said in err[0], err
    assert err[0].startswith("python -m megatron_lgs.lgs.calibrate: error: "), err
