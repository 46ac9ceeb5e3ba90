"""Mixed precision: FP16 dynamic loss scaling against an injected overflow, and FP8 settings
passed to megatron-core explicitly."""

from __future__ import annotations

import math

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.model import transformer_config
from megatron_lgs.platform import get_platform
from megatron_lgs.run_config import PrecisionConfig
from tests.conftest import run_pretrain

K = 5  # the iteration whose gradients overflow
FP16 = ["--fp16", "--initial-loss-scale", "1024", "--train-iters", "8", "--log-interval", "4"]


@pytest.fixture(scope="module")
def never_stepped_at_k(tmp_path_factory, data_cache) -> list[dict]:
    from tests.conftest import TINY_GPT

    run = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *FP16, "--hysteresis", "1",
                        "--iterations-to-skip", str(K)], save_dir=tmp_path_factory.mktemp("s"))
    return run.records("train")


@pytest.mark.parametrize("hysteresis,backoff", [(1, 0.5), (2, 1.0)])
def test_injected_inf_gradient_skips_the_step_backs_off_and_training_continues(
        never_stepped_at_k, tiny, tmp_path, hysteresis, backoff):
    run = run_pretrain([*tiny, *FP16, "--hysteresis", str(hysteresis), "--inject-inf-grad-at",
                        str(K)], save_dir=tmp_path / "c")
    records = run.records("train")
    assert [r["skipped"] for r in records] == [i == K for i in range(1, 9)]
    k = records[K - 1]
    assert k["reason"] == "loss scale overflow" and math.isfinite(k["loss"])
    # megatron's rule: each overflow uses up one unit of hysteresis; at zero the scale halves.
    assert k["loss_scale"] == records[K - 2]["loss_scale"] * backoff == 1024 * backoff
    assert all(r["loss_scale"] == k["loss_scale"] for r in records[K:])
    # The update was dropped: the next loss is the one of a run that never stepped at K (the
    # forward does not depend on the scale); later ones differ only by fp16 rounding.
    reference = never_stepped_at_k
    assert [r["loss"] for r in records[:K - 1]] == [r["loss"] for r in reference[:K - 1]]
    assert records[K]["loss"] == reference[K]["loss"]
    for ours, theirs in zip(records[K + 1:], reference[K + 1:], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-3)
    assert records[-1]["loss"] < records[0]["loss"]


def test_fp8_settings_reach_megatron_core_explicitly():
    cfg = parse_args(["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                      "--fp8-margin", "1", "--fp8-amax-history-len", "16",
                      "--fp8-amax-compute-algo", "max"], world_size=1)
    config = transformer_config(cfg, get_platform())
    assert (config.fp8, config.fp8_recipe, config.fp8_margin, config.fp8_amax_history_len,
            config.fp8_amax_compute_algo) == ("hybrid", "tensorwise", 1, 16, "max")


def test_fp8_defaults_are_megatron_lms_written_down_not_transformer_engines():
    defaults = PrecisionConfig()
    assert (defaults.fp8_recipe, defaults.fp8_margin, defaults.fp8_amax_history_len,
            defaults.fp8_amax_compute_algo) == ("delayed", 0, 1, "most_recent")
    config = transformer_config(parse_args(["--fp8-format", "e4m3"], world_size=1),
                                get_platform())
    assert (config.fp8, config.fp8_recipe, config.fp8_amax_history_len,
            config.fp8_amax_compute_algo) == ("e4m3", "delayed", 1, "most_recent")


def test_fp8_amax_history_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--fp8-format", "e4m3", "--fp8-amax-history-len", "0"], world_size=1)
    assert exit_info.value.code == 2
    assert "--fp8-amax-history-len must be at least 1" in capsys.readouterr().err


def test_tp_only_amax_reduction_reaches_megatron_core_and_needs_delayed_scaling(capsys):
    fp8 = ["--bf16", "--fp8-format", "hybrid"]
    assert not transformer_config(parse_args(fp8, world_size=1), get_platform()).tp_only_amax_red
    config = transformer_config(parse_args([*fp8, "--tp-only-amax-red"], world_size=1),
                                get_platform())
    assert config.tp_only_amax_red
    for argv in (["--bf16", "--tp-only-amax-red"],
                 [*fp8, "--fp8-recipe", "tensorwise", "--tp-only-amax-red"]):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(argv, world_size=1)
        assert exit_info.value.code == 2
        assert "--tp-only-amax-red applies to FP8 delayed scaling" in capsys.readouterr().err
