"""What `predict` reads from a run that leaves a setting unset (`run_defaults`): an FP16 run is
Megatron-LM of 2021 unless it says otherwise, and each line names what was read that way."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from megatron_lgs.lgs.predict import predict_file
from megatron_lgs.lgs.run_defaults import FP16_SOFTWARE
from megatron_lgs.lgs.runspec import RunError, read_run, run_from_dict
from megatron_lgs.lgs.stepmodel import predict_run

# Narayanan et al. 2021's 18.4B row (Table 1) in the issue's fields only.
FP16_RUN = {"id": "narayanan-18.4b", "gpu": "a100-80gb", "num_gpus": 256, "num_layers": 40,
            "hidden": 6144, "heads": 48, "vocab": 51200, "seq_length": 2048, "tp": 8, "pp": 1,
            "micro_batch": 8, "global_batch": 1024, "recompute": "full", "precision": "fp16"}
SOFTWARE_2021 = {**FP16_SOFTWARE, "sequence_parallel": False}


def test_an_fp16_run_is_read_as_megatron_lm_of_2021() -> None:
    r, assumed = read_run(FP16_RUN)
    assert assumed == SOFTWARE_2021
    assert not r.flash_attention and not r.sequence_parallel and not r.grad_buffer
    explicit = predict_run(run_from_dict({**FP16_RUN, **SOFTWARE_2021}))
    assert predict_run(r).step_time_s == explicit.step_time_s
    # Unfused attention and blocking TP all-reduces are slower than today's defaults.
    modern = run_from_dict({**FP16_RUN, "precision": "bf16"})
    assert predict_run(r).step_time_s > predict_run(modern).step_time_s


def test_what_a_run_sets_is_kept_and_not_reported() -> None:
    given = {**FP16_RUN, "flash_attention": True, "sequence_parallel": True}
    r, assumed = read_run(given)
    assert r.flash_attention and r.sequence_parallel
    assert "flash_attention" not in assumed and "sequence_parallel" not in assumed
    assert read_run({**FP16_RUN, "precision": "bf16"})[1] == {}
    # An FP16 run with what Megatron-LM of 2021 lacked ran later code: today's defaults.
    for later in ({"num_experts": 8, "moe_topk": 2, "ep": 4}, {"cp": 2},
                  {"distributed_optimizer": True}):
        r, assumed = read_run({**FP16_RUN, **later})
        assert assumed == {} and r.flash_attention and r.sequence_parallel, later


def test_predict_lines_name_what_was_assumed(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    bf16_405b = {**FP16_RUN, "id": "405b", "gpu": "h100-sxm", "precision": "bf16",
                 "num_layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8,
                 "num_gpus": 512, "pp": 8, "vpp": 8, "micro_batch": 1, "global_batch": 512,
                 "recompute": None, "distributed_optimizer": True}
    path.write_text(json.dumps([FP16_RUN, bf16_405b]))
    out, err = io.StringIO(), io.StringIO()
    assert predict_file(path, out, err) == 0, err.getvalue()
    fp16, split = (json.loads(x) for x in out.getvalue().splitlines())
    assert fp16["assumed"] == SOFTWARE_2021
    assert split["assumed"] == {"account_for_embedding_in_pipeline_split": True,
                                "account_for_loss_in_pipeline_split": True}


QWEN3_235B_LIKE = {"id": "qwen3-235b-like", "gpu": "h100-sxm", "num_gpus": 256,
                   "num_layers": 16, "hidden": 4096, "ffn_hidden": 1536, "heads": 64,
                   "kv_heads": 4, "vocab": 151936, "seq_length": 4096, "tp": 2, "pp": 8,
                   "ep": 32, "micro_batch": 1, "global_batch": 256, "swiglu": True,
                   "num_experts": 128, "moe_topk": 8}


def test_an_moe_run_whose_default_expert_tp_cannot_fit_takes_etp_1() -> None:
    """TP2 EP32 on 256 GPUs over 8 stages: 32 GPUs a stage cannot hold EP32 x ETP2, which
    megatron-core refuses, so the run had whole experts per GPU, even with experts wider than
    the hidden size; a run that says etp 2 is refused naming ep."""
    coarse = {**QWEN3_235B_LIKE, "ffn_hidden": 14336}
    r, assumed = read_run(coarse)
    assert assumed == {"etp": 1} and r.etp == 1
    assert read_run({**coarse, "ep": 8})[1] == {}  # 8 x 2 fits: etp stays tp
    assert read_run({**coarse, "ep": 8})[0].etp == 2
    with pytest.raises(RunError) as err:
        read_run({**coarse, "etp": 2})
    assert err.value.field == "ep"


def test_a_fine_grained_moe_run_with_tp_takes_etp_1() -> None:
    """Experts narrower than the hidden size (as the issue's fields give an MoE run, its one
    MLP width the experts', or moe_ffn_hidden) are whole on each GPU unless the run says
    otherwise, as megatron-core's MoE README recommends: where etp = tp would fit too."""
    fits = {**QWEN3_235B_LIKE, "ep": 8}
    r, assumed = read_run(fits)
    assert assumed == {"etp": 1} and r.etp == 1
    assert read_run({**fits, "etp": 2})[0].etp == 2 and read_run({**fits, "etp": 2})[1] == {}
    wide = {**fits, "ffn_hidden": 14336, "moe_ffn_hidden": 1536}
    assert read_run(wide)[1] == {"etp": 1}  # the experts' width decides, not the dense MLP's
    assert read_run({**wide, "moe_ffn_hidden": 8192})[1] == {}
    assert read_run({**fits, "tp": 1, "num_gpus": 128})[1] == {}  # no TP: nothing to read
