"""`simulate predict RUNS.json` (its JSON lines and one-line errors) and the layout planner on
the seed's 100B case and launch/configs/gpt-10b.sh (the published-runs table:
test_published_runs.py)."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_lgs.arguments import build_parser, config_from_namespace
from megatron_lgs.lgs.gpus import GPUS, link_profile
from megatron_lgs.lgs.layercost import TERMS
from megatron_lgs.lgs.plan_models import best_flags, resolve
from megatron_lgs.lgs.plan_run import (
    A2A_OVERLAP_EVIDENCE,
    FINE_MOE_CAVEAT,
    HOPPER_CAVEAT,
    caveats,
    questions,
)
from megatron_lgs.lgs.plan_run import main as plan_main
from megatron_lgs.lgs.planner import (
    best_of,
    candidates,
    fits,
    model_flags,
    with_thresholds,
)
from megatron_lgs.lgs.predict import predict_file
from megatron_lgs.lgs.runcheck import stage_tensors_per_layer
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.simulate import cli
from megatron_lgs.lgs.stepmodel import predict_run, sync_workload
from megatron_lgs.lgs.workload import stage_backward
from megatron_lgs.validation import validate

ROOT = Path(__file__).resolve().parents[3]
DENSE = {"id": "dense", "gpu": "a100-80gb", "num_gpus": 16, "gpus_per_node": None,
         "nic_gbit_per_gpu": None, "num_layers": 40, "hidden": 5120, "ffn_hidden": 13824,
         "heads": 40, "kv_heads": 8, "vocab": 32000, "seq_length": 4096, "tp": 4, "pp": 2,
         "cp": None, "dp": None, "ep": None, "vpp": None, "micro_batch": 1, "global_batch": 512,
         "recompute": None, "precision": None, "swiglu": True, "num_experts": None,
         "moe_topk": None, "distributed_optimizer": True, "sequence_parallel": None,
         "comment": "unknown fields are ignored"}
MOE = {"id": "moe", "gpu": "h100-sxm", "num_gpus": 64, "num_layers": 16, "hidden": 4096,
       "ffn_hidden": 14336, "heads": 32, "kv_heads": 8, "vocab": 32000, "seq_length": 4096,
       "tp": 2, "pp": 2, "ep": 8, "micro_batch": 1, "global_batch": 256, "swiglu": True,
       "num_experts": 16, "moe_topk": 2, "distributed_optimizer": True,
       "recompute": "selective"}
KEYS = {"id", "predicted_step_time_s", "predicted_tflops_per_gpu", "predicted_mfu",
        "fits_memory", "peak_memory_gb", "breakdown", "unknown_fields", "inert_fields",
        "assumed"}


def _predict(runs: list, tmp_path: Path) -> tuple[int, list[dict], list[str]]:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    out, err = io.StringIO(), io.StringIO()
    code = predict_file(path, out, err)
    return code, [json.loads(x) for x in out.getvalue().splitlines()], \
        err.getvalue().splitlines()


def test_predict_cli_dense_and_moe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([DENSE, MOE]))
    # What `python -m megatron_lgs.lgs.simulate predict RUNS.json` runs, in-process.
    assert cli(["predict", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = [json.loads(x) for x in captured.out.splitlines()]
    assert [x["id"] for x in lines] == ["dense", "moe"]
    for x in lines:
        assert set(x) == KEYS and set(x["breakdown"]) == set(TERMS)
        assert sum(x["breakdown"].values()) == pytest.approx(x["predicted_step_time_s"],
                                                             rel=1e-4)
        assert 0 < x["predicted_mfu"] < 1 and isinstance(x["fits_memory"], bool)
    assert lines[1]["breakdown"]["moe_all_to_all"] > 0 == lines[0]["breakdown"]["moe_all_to_all"]
    assert lines[1]["breakdown"]["recompute"] > 0
    assert cli(["predict"]) == 2  # usage


# A dense BF16 run on one node without virtual stages or TP, each knob set away from its
# default, where none of them can act.
INERT = {"fp8_recipe": "current", "fp8_params": False, "tp_only_amax_red": True,
         "async_amax_reduction": True, "moe_topk": 8, "moe_ffn_hidden": 1024,
         "sequence_parallel": True, "tp_comm_overlap": True, "tp_async_backward": False,
         "rope_fusion": False, "overlap_param_gather": False, "overlap_p2p_comm": False,
         "p2p_scatter_gather": True, "nic_gbit_per_gpu": 25.0}


def test_predict_names_the_fields_it_ignored(tmp_path: Path) -> None:
    """Misspelt keys and knobs that cannot act on the run are ignored, as the issue's
    interface says, and named in the run's line; an inert knob changes no figure, and the same
    knob where it can act does."""
    base = {**DENSE, "num_gpus": 8, "tp": 1, "pp": 1, "distributed_optimizer": False}
    code, [line], _ = _predict([{**base, **INERT, "micro_bach": 4}], tmp_path)
    assert code == 0
    assert line["unknown_fields"] == ["comment", "micro_bach"]
    assert sorted(line["inert_fields"]) == sorted(INERT)
    alone = predict_run(run_from_dict(base))
    for field, value in INERT.items():
        e = predict_run(run_from_dict({**base, field: value}))
        assert e.step_time_s == alone.step_time_s, field
        assert e.breakdown == alone.breakdown and e.memory == alone.memory, field
    # Where they can act: TP 2 with its overlap, FP8 delayed scaling on H100 over 2 nodes.
    acting = {**base, "gpu": "h100-sxm", "num_gpus": 16, "tp": 2, "precision": "fp8"}
    _, [line], _ = _predict([{**acting, "tp_comm_overlap": True, "tp_only_amax_red": True,
                              "nic_gbit_per_gpu": 100.0}], tmp_path)
    assert line["inert_fields"] == []
    for field, value in (("tp_comm_overlap", True), ("tp_only_amax_red", True),
                         ("nic_gbit_per_gpu", 25.0)):
        e = predict_run(run_from_dict({**acting, field: value}))
        assert e.step_time_s != predict_run(run_from_dict(acting)).step_time_s, field


@pytest.mark.parametrize("bad,field", [
    ({"dp": 4}, "dp"),                       # tp x pp x cp x dp != num_gpus
    ({"num_gpus": 30}, "num_gpus"),          # not divisible by tp x pp
    ({"hidden": None}, "hidden"),            # missing required field
    ({"gpu": "tpu-v5"}, "gpu"),
    ({"recompute": "some"}, "recompute"),
    ({"global_batch": 101}, "global_batch"),
    ({"precision": "fp8"}, "precision"),     # A100 has no FP8
    ({"tp": "4"}, "tp"),
    ({"etp": 3}, "etp"),                     # expert TP on a dense model
    # 12 DP ranks of TP1 on nodes of 8: a node holds ranks of two stages, which the
    # gradient sync's replay does not place.
    ({"num_gpus": 24, "tp": 1, "pp": 2, "global_batch": 480}, "dp"),
    ({"dropout": 1.0}, "dropout"),           # not a probability of dropping
    ({"nic_gbit_per_gpu": float("nan")}, "nic_gbit_per_gpu"),
    ({"num_experts": -1}, "num_experts"),
    ({"optimizer_state_bytes": 0}, "optimizer_state_bytes"),
    # Beyond any model: refused at once instead of building a billion layers' tensors.
    ({"num_layers": 10**9}, "num_layers"),
    ({"num_experts": 10**8, "moe_topk": 2, "ep": 4}, "num_experts"),
    ({"num_gpus": 4 * 10**9, "pp": 10**9, "num_layers": 10**9}, "pp"),
    ({"num_layers": 2 * 10**5, "vpp": 10**5}, "vpp"),
])
def test_predict_one_line_error_names_run_and_field(tmp_path: Path, bad: dict,
                                                    field: str) -> None:
    code, lines, err = _predict([DENSE, {**DENSE, "id": "broken", **bad}, MOE], tmp_path)
    assert code == 2
    assert [x["id"] for x in lines] == ["dense", "moe"]  # the others are still predicted
    assert len(err) == 1 and "run broken" in err[0] and repr(field) in err[0]


def test_predict_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    path.write_text("{not json")
    err = io.StringIO()
    assert predict_file(path, io.StringIO(), err) == 2
    assert len(err.getvalue().splitlines()) == 1
    path.write_text(json.dumps({"id": "x"}))
    assert predict_file(path, io.StringIO(), io.StringIO()) == 2


@pytest.mark.parametrize("model,gpus", [("gpt-100b", 128), ("launch/configs/gpt-10b.sh", 16),
                                        ("launch/configs/gpt-100b-moe.sh", 128)])
def test_planner_fits_and_beats_the_config_layout(model: str, gpus: int,
                                                  capsys: pytest.CaptureFixture) -> None:
    plans = plan_main(["--model", model, "--gpus", str(gpus), "--hardware", "a100-80gb",
                       "--top", "2"])
    out = capsys.readouterr().out
    base, ref = resolve(model, "a100-80gb", gpus, None, None)
    assert ref is not None and "own layout" in out
    flags = next(line for line in out.splitlines() if line.startswith("best flags: "))
    assert "--num-layers" in flags and "--tensor-model-parallel-size" in flags
    assert predict_run(ref).fits_memory  # a launch config fits the GPUs it is written for
    assert plans and all(p.estimate.fits_memory for p in plans)
    assert plans[0].estimate.step_time_s <= predict_run(ref).step_time_s
    assert plans[0].estimate.step_time_s <= plans[-1].estimate.step_time_s
    for q in ("ZeRO-2 vs ZeRO-3", "TP inside a node", "slower inter-node network",
              "bucket thresholds"):
        assert q in out


# One layout of each kind the planner can propose: its flag line must be one the trainer runs.
KINDS = {"ZeRO-0": lambda r: r.zero == 0, "ZeRO-1": lambda r: r.zero == 1,
         "ZeRO-2": lambda r: r.zero == 2, "ZeRO-3": lambda r: r.zero == 3,
         "TP": lambda r: r.tp > 1, "PP": lambda r: r.pp > 1, "VPP": lambda r: r.vpp > 1,
         "CP": lambda r: r.cp > 1, "EP": lambda r: r.ep > 1,
         "ETP1": lambda r: bool(r.num_experts) and r.tp > 1 and r.etp == 1,
         "A2A overlap": lambda r: r.moe_a2a_overlap,
         "full recompute": lambda r: r.recompute == "full",
         "selective recompute": lambda r: r.recompute == "selective"}


def test_model_flags_carry_the_head_width() -> None:
    """A run whose heads are wider than hidden / heads gets --kv-channels on its flag line."""
    r = run_from_dict({"id": "wide", "gpu": "h100-sxm", "num_gpus": 8, "num_layers": 4,
                       "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
                       "vocab": 32000, "seq_length": 4096, "tp": 1, "pp": 1, "micro_batch": 1,
                       "global_batch": 8})
    argv = " ".join(model_flags(r)).split()
    m = config_from_namespace(build_parser().parse_args(argv), 8).model
    assert (m.kv_channels, m.query_groups) == (128, 4)
    plain = replace(r, head_dim=64)
    assert "--kv-channels" not in " ".join(model_flags(plain))


@pytest.mark.parametrize("model,gpus,gpu", [("launch/configs/gpt-10b.sh", 64, "h100-sxm"),
                                            ("gpt-100b", 128, "a100-80gb"),
                                            ("gpt-100b-moe", 128, "h100-sxm")])
def test_planner_flag_lines_pass_the_trainers_validation(model: str, gpus: int,
                                                         gpu: str) -> None:
    base, _ = resolve(model, gpu, gpus, None, None)
    cands = candidates(base)
    seen = set()
    for kind, where in KINDS.items():
        for est in best_of(cands, 1, where):
            seen.add(kind)
            plan = with_thresholds(est, [64])
            argv = best_flags(model, base, plan).split()
            validate(config_from_namespace(build_parser().parse_args(argv), gpus))
            assert ("--lgs" in argv) == (est.run.zero < 2), (kind, argv)
            assert ("--overlap-moe-expert-parallel-comm" in argv) == est.run.moe_a2a_overlap
    assert set(KINDS) - {"ZeRO-2", "EP", "ETP1", "A2A overlap"} <= seen  # ZeRO-2: the 10B only
    moe = {"EP", "ETP1", "A2A overlap"}
    assert moe <= seen if base.num_experts else not moe & seen


@pytest.mark.parametrize("extra,said", [
    (["--gpus", "0"], "--gpus"), (["--top", "0"], "--top"),
    (["--global-batch", "0"], "--global-batch"), (["--nic-gbit-per-gpu", "0"], "--nic-gbit"),
    (["--nic-gbit-per-gpu", "inf"], "--nic-gbit"), (["--nic-gbit-per-gpu", "nan"], "--nic-gbit"),
    (["--gpus", "11", "--gpus-per-node", "1"], "no layout of gpt-10b divides 11 GPUs"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--gpus", "12"], "--gpus 12 does not fill nodes of --gpus-per-node 8"),
    (["--model", "launch/configs/missing.sh"], "no launch config file launch/configs/missing.sh"),
    (["--model", "gpt-7b"], "unknown model 'gpt-7b': simulator presets ['gpt-100b'"),
    (["--out-dir", "/proc/no/such/dir"], "--out-dir /proc/no/such/dir: No such file"),
    (["--json", "/proc/no/such/plan.json"], "--json /proc/no/such/plan.json: No such file"),
    (["--json", "/tmp"], "--json /tmp: Is a directory"),
    (["--json", "/proc/version"], "--json /proc/version: "),
    (["--seq-length", "2048"], "--seq-length is for a Hugging Face config; gpt-10b has its own"),
    (["--seq-length", "0"], "--seq-length must be"),
])
def test_planner_bad_input_is_one_line(extra: list[str], said: str,
                                       capsys: pytest.CaptureFixture) -> None:
    argv = ["--model", "gpt-10b", "--gpus", "64", "--hardware", "a100-80gb", *extra]
    with pytest.raises(SystemExit) as exc:
        plan_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and said in err[0], err


def test_planner_json_is_what_it_prints_and_predict_takes(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    out_file = tmp_path / "plan.json"
    plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", "16", "--hardware",
               "a100-80gb", "--top", "3", "--json", str(out_file)])
    printed = capsys.readouterr().out.splitlines()
    plan = json.loads(out_file.read_text())
    assert (plan["gpus"], plan["gpus_per_node"], plan["global_batch"]) == (16, 8, 512)
    assert len(plan["plans"]) == 3 and plan["config_layout"] is not None
    assert f"best flags: {plan['plans'][0]['flags']}" in printed
    assert [f"answer: {a}" for a in plan["answers"]] == \
        [line for line in printed if line.startswith("answer: ")]
    runs = [p["run"] for p in plan["plans"]] + [plan["config_layout"]["run"]]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    out = io.StringIO()
    assert predict_file(tmp_path / "runs.json", out=out) == 0
    again = [json.loads(line)["predicted_step_time_s"] for line in out.getvalue().splitlines()]
    steps = [p["predicted_step_time_s"] for p in plan["plans"] + [plan["config_layout"]]]
    assert again == steps and steps[:3] == sorted(steps[:3])


def _hf_llama(folder: Path) -> Path:
    """A Llama-shaped Hugging Face config (GQA, untied, RoPE theta of Llama 3), no weights."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                max_position_embeddings=8192, rope_theta=500000.0,
                tie_word_embeddings=False).save_pretrained(folder)
    return folder


def test_planner_plans_a_hugging_face_config(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A Hugging Face model (its folder or its config.json) is planned as its config says, at
    the training length and batch given, and its flag line passes the trainer's validation."""
    from transformers import Qwen3MoeConfig

    folder = _hf_llama(tmp_path / "llama")
    base, ref = resolve(str(folder / "config.json"), "a100-80gb", 16, 64, None, 8, 2048)
    assert ref is None and base.global_batch == 64
    assert (base.num_layers, base.hidden, base.ffn_hidden, base.heads, base.kv_heads, base.vocab,
            base.seq_length) == (16, 2048, 5632, 16, 4, 32000, 2048)
    assert base.swiglu and base.untie_embeddings and base.position_embedding == "rope"
    plan_main(["--model", str(folder), "--gpus", "16", "--hardware", "a100-80gb",
               "--global-batch", "64", "--seq-length", "2048", "--top", "1"])
    flags = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("best flags: ")).split()[2:]
    cfg = config_from_namespace(build_parser().parse_args(flags), 16)
    validate(cfg)
    m = cfg.model
    assert (m.seq_length, m.max_position_embeddings, m.rotary_base, m.query_groups,
            cfg.precision.bf16) == (2048, 8192, 500000, 4, True)
    Qwen3MoeConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, moe_intermediate_size=256,
                   num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, vocab_size=32000,
                   tie_word_embeddings=False).save_pretrained(tmp_path / "moe")
    moe, _ = resolve(str(tmp_path / "moe"), "h100-sxm", 16, 64, None, 8, 4096)
    assert (moe.num_experts, moe.moe_topk, moe.moe_ffn_hidden, moe.head_dim) == (32, 4, 256, 128)
    assert moe.qk_layernorm


@pytest.mark.parametrize("extra,said", [
    (["--global-batch", "64"], "has no training length or batch: give --seq-length and"),
    (["--seq-length", "2048"], "has no training length or batch: give --seq-length and"),
    (["--global-batch", "64", "--seq-length", "16384"],
     "--max-position-embeddings (8192) is smaller than --seq-length (16384)"),
])
def test_planner_on_a_hugging_face_config_says_what_is_missing(
        extra: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _hf_llama(tmp_path / "llama")
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(folder), "--gpus", "16", "--hardware", "a100-80gb", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and said in err[0], err


def test_planner_refuses_a_hugging_face_model_it_cannot_express(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "bert"), "--gpus", "8", "--hardware", "h100-sxm",
                   "--global-batch", "8", "--seq-length", "512"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "model type 'bert' has no" in err[0], err


def test_planner_takes_the_nodes_size(capsys: pytest.CaptureFixture) -> None:
    """Nodes of 4 (an A100 cluster such as Perlmutter's): TP 8 leaves the node and pays for it."""
    plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", "16", "--hardware",
               "a100-40gb", "--gpus-per-node", "4", "--top", "1"])
    out = capsys.readouterr().out
    assert "16 x a100-40gb (4 a node)" in out, out
    assert re.search(r"TP inside a node \(<= 4\) vs across: inside .* vs across TP8 .*: inside "
                     r"faster", out), out
    base, _ = resolve("launch/configs/gpt-10b.sh", "a100-40gb", 16, None, None,
                      gpus_per_node=4)
    tp8 = replace(base, tp=8, etp=8, dp=2, sequence_parallel=True)
    in_nodes_of_8 = predict_run(replace(tp8, gpus_per_node=8))
    in_nodes_of_4 = predict_run(tp8)
    assert in_nodes_of_4.breakdown["tp_comm"] > 2 * in_nodes_of_8.breakdown["tp_comm"]


def test_planner_on_a_config_bash_cannot_source_is_one_line(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "mine.sh").write_text("CONFIG_ARGS=(\n  --num-layers 2\n")  # unclosed
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "8", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "could not source it" in err[0], err


def test_planner_names_the_config_whose_flags_are_bad(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "mine.sh").write_text("CONFIG_ARGS=(--num-layers 2 --no-such-flag)\n")
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "8", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"plan_run: launch config {tmp_path / 'mine.sh'}: error: "), err
    assert "--no-such-flag" in err[0], err


@pytest.mark.parametrize("flag", ["--optimizer-cpu-offload",
                                  "--reduce-scatter-with-fp32-accumulation",
                                  "--num-distributed-optimizer-instances 2 --no-save"])
def test_planner_refuses_optimizer_options_it_does_not_time(flag: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """Each needs a ZeRO-1 layout; planned as if unset, the 10B's best (ZeRO-3) flag line with
    the option would fail the trainer's validation."""
    config = Path("launch/configs/gpt-10b.sh").read_text()
    (tmp_path / "mine.sh").write_text(config.replace("--loss-spike-action skip",
                                                     f"--loss-spike-action skip {flag}"))
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "16", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert f"sets {flag.split()[0]}: the step model does not time" in err[0], err


def test_planner_says_its_hopper_mfu_is_optimistic(capsys: pytest.CaptureFixture) -> None:
    for gpu, said in (("h200", True), ("a100-80gb", False)):
        plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", "16", "--hardware", gpu,
                   "--top", "1"])
        assert (HOPPER_CAVEAT in capsys.readouterr().out) == said, gpu


def test_planner_says_its_fine_grained_moe_figures_are_not_predictions() -> None:
    # gpt-100b-moe.sh: 64 experts of 2560 on a hidden of 4096; gpt-10b.sh is dense.
    for model, said in (("launch/configs/gpt-100b-moe.sh", True),
                        ("launch/configs/gpt-10b.sh", False)):
        base, _ = resolve(model, "a100-80gb", 128, None, None)
        assert (FINE_MOE_CAVEAT in caveats("a100-80gb", base)) == said, model
    coarse, _ = resolve("launch/configs/gpt-100b-moe.sh", "a100-80gb", 128, None, None)
    assert FINE_MOE_CAVEAT not in caveats("a100-80gb", replace(coarse, moe_ffn_hidden=14336))


def test_planner_answers_the_all_to_all_overlap_for_moe_only() -> None:
    """An MoE's answers set the best layout with the EP all-to-all overlap beside the best
    without it, with what the published pair says of the overlap; a dense model has none."""
    for model, gpus in (("launch/configs/gpt-100b-moe.sh", 32), ("gpt-10b", 16)):
        base, _ = resolve(model, "h100-sxm", gpus, None, None)
        cands = candidates(base)
        answers = [a for a in questions(cands, best_of(cands, 1)[0], base)
                   if a.startswith("EP all-to-all overlap")]
        if not base.num_experts:
            assert answers == [], model
            continue
        assert len(answers) == 1 and answers[0].endswith(A2A_OVERLAP_EVIDENCE), answers
        on, off = re.search(r"on vs off: on (.*) \d+\.\d+ s vs off (.*) \d+\.\d+ s",
                            answers[0]).groups()
        assert "A2A-overlap" in on and "A2A-overlap" not in off, answers


def test_planner_keeps_a_configs_dispatcher_and_plans_the_all_to_all(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A user's MoE config on the trainer's default allgather dispatcher is predicted with it
    beside the planner's layouts, which name (and are predicted with) the all-to-all one."""
    (tmp_path / "moe.sh").write_text(
        "CONFIG_ARGS=(--num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --num-experts 8 --moe-router-topk 2 --disable-bias-linear "
        "--expert-model-parallel-size 4 --bf16 --micro-batch-size 1 --global-batch-size 64 "
        "--vocab-size 32000)\n")
    spec = str(tmp_path / "moe.sh")
    base, ref = resolve(spec, "a100-80gb", 8, None, None)
    assert ref is not None and ref.moe_dispatcher == "allgather"
    assert predict_run(ref).step_time_s != predict_run(
        replace(ref, moe_dispatcher="alltoall")).step_time_s
    cands = candidates(base)
    assert cands and all(r.moe_dispatcher == "alltoall" for _, _, r in cands if r.num_experts)
    plan_main(["--model", spec, "--gpus", "8", "--hardware", "a100-80gb", "--top", "1"])
    out = capsys.readouterr().out
    assert "--moe-token-dispatcher-type alltoall" in out
    assert re.search(r"ref TP1 PP1 EP4 allgather DP8 .* own layout", out), out


def test_planner_tries_every_virtual_stage_count_a_stage_divides_into() -> None:
    """80 layers on 4 stages: 1, 2, 4, 5, 10 and 20 virtual stages (NVIDIA's Llama 3 70B recipes
    run 5); Llama 3.1 405B's 126 layers on 8 stages count the embedding and the loss: 16 a
    stage, so 1, 2, 4, 8 and 16."""
    from megatron_lgs.lgs.planner import _virtual_stages, layouts

    llama70b = run_from_dict({"id": "l", "gpu": "h100-sxm", "num_gpus": 64, "num_layers": 80,
                              "hidden": 8192, "ffn_hidden": 28672, "heads": 64, "kv_heads": 8,
                              "vocab": 128256, "seq_length": 8192, "tp": 1, "pp": 1,
                              "micro_batch": 1, "global_batch": 128, "swiglu": True})
    assert _virtual_stages(llama70b, 4) == [1, 2, 4, 5, 10, 20]
    assert _virtual_stages(llama70b, 1) == [1]
    counted = replace(llama70b, num_layers=126, account_for_embedding_in_pipeline_split=True,
                      account_for_loss_in_pipeline_split=True)
    assert _virtual_stages(counted, 8) == [1, 2, 4, 8, 16]
    assert any((r.tp, r.pp, r.vpp, r.cp) == (4, 4, 5, 2) for r in layouts(llama70b))


def test_planner_says_one_node_has_no_network_to_slow(capsys: pytest.CaptureFixture) -> None:
    """On one node no traffic crosses the network: the answer says so rather than print a
    network's costs of +0.0%; on two nodes it prices half and a quarter of the network."""
    for gpus, said in ((8, "slower inter-node network: none crosses one, the 8 GPUs share a "
                           "node"),
                       (16, "slower inter-node network, best layout at 200 Gb/s per GPU")):
        plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", str(gpus), "--hardware",
                   "a100-80gb", "--global-batch", "64", "--top", "1"])
        assert f"answer: {said}" in capsys.readouterr().out, gpus


def test_planner_on_three_nodes_skips_groups_that_straddle_them(
        capsys: pytest.CaptureFixture) -> None:
    """24 GPUs: a layout whose data-parallel group does not fill its nodes evenly (PP2 DP12)
    is not a candidate, and the planner answers (it stopped with a traceback until
    2026-12-07)."""
    base, _ = resolve("launch/configs/gpt-10b.sh", "a100-80gb", 24, 480, None)
    cands = candidates(base)
    assert cands and not any((r.tp, r.pp) == (1, 2) for _, _, r in cands)
    plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", "24", "--hardware",
               "a100-80gb", "--global-batch", "480", "--top", "1"])
    assert "best flags: " in capsys.readouterr().out


def test_planner_says_why_a_configs_own_layout_is_not_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A user's PP2 config on 24 GPUs (DP 12 over three nodes of 8): its layout is one the
    model does not place, and the planner says so where the config's row would stand."""
    (tmp_path / "pp2.sh").write_text(
        "CONFIG_ARGS=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --pipeline-model-parallel-size 2 --use-distributed-optimizer "
        "--overlap-grad-reduce --bf16 --micro-batch-size 1 --global-batch-size 48 "
        "--vocab-size 32000)\n")
    out_file = tmp_path / "plan.json"
    plan_main(["--model", str(tmp_path / "pp2.sh"), "--gpus", "24", "--hardware", "a100-80gb",
               "--top", "1", "--json", str(out_file)])
    out = capsys.readouterr().out
    said = "own layout is not predicted on 24 GPUs: field 'dp': a data-parallel group of 12"
    assert said in out and " ref " not in out, out
    plan = json.loads(out_file.read_text())
    assert plan["config_layout"] is None and said in plan["config_layout_refused"]


def test_planner_never_proposes_what_does_not_fit() -> None:
    # A 10B model on 8 x 32 GB V100s: most layouts do not fit; none of them is a candidate.
    base, _ = resolve("launch/configs/gpt-10b.sh", "v100-32gb", 8, 64, None)
    cands = candidates(base)
    assert cands and all(fits(r) for _, _, r in cands)
    from megatron_lgs.lgs.planner import layouts

    assert sum(1 for r in layouts(base) if not fits(r)) > 0


def test_planner_takes_the_trainers_rope_fusion_and_all_to_all_overlap() -> None:
    """The planner's GPUs run TE, so a RoPE model is fused unless its flags say otherwise; a
    config's query/key norms, EP all-to-all overlap, FP8 amax group and DDP bucket size reach
    the model."""
    from megatron_lgs.lgs.plan_models import trainer_run_fields

    rope = ["--position-embedding-type", "rope"]
    for extra, fused in (([], True), (["--no-rope-fusion"], False)):
        cfg = config_from_namespace(build_parser().parse_args([*rope, *extra]), 8)
        model, _ = trainer_run_fields(cfg, 8)
        assert (model["position_embedding"], model["rope_fusion"]) == ("rope", fused)
    for extra, qk in (([], False), (["--qk-layernorm"], True)):
        cfg = config_from_namespace(build_parser().parse_args(extra), 8)
        assert trainer_run_fields(cfg, 8)[0]["qk_layernorm"] == qk
    moe = ["--num-experts", "4", "--disable-bias-linear", "--expert-model-parallel-size", "2",
           "--moe-token-dispatcher-type", "alltoall", "--bf16"]
    for extra, overlap in (([], False), (["--overlap-moe-expert-parallel-comm"], True)):
        cfg = config_from_namespace(build_parser().parse_args([*moe, *extra]), 8)
        assert trainer_run_fields(cfg, 8)[1]["moe_a2a_overlap"] == overlap
    for dispatcher in ("allgather", "alltoall"):  # the trainer's default, then the planner's
        argv = [*moe, "--moe-token-dispatcher-type", dispatcher]
        cfg = config_from_namespace(build_parser().parse_args(argv), 8)
        assert trainer_run_fields(cfg, 8)[1]["moe_dispatcher"] == dispatcher
    fp8 = ["--bf16", "--fp8-format", "hybrid"]
    for extra, tp_only in (([], False), (["--tp-only-amax-red"], True)):
        cfg = config_from_namespace(build_parser().parse_args([*fp8, *extra]), 8)
        assert trainer_run_fields(cfg, 8)[0]["tp_only_amax_red"] == tp_only
    ddp = ["--use-distributed-optimizer", "--overlap-grad-reduce"]
    for extra, size in (([], 0), (["--ddp-bucket-size", "200"], 200)):
        cfg = config_from_namespace(build_parser().parse_args([*ddp, *extra]), 8)
        assert trainer_run_fields(cfg, 8)[1]["ddp_bucket_size"] == size
    # The overlaps the trainer runs: its flags, LGS's hooks, and what Megatron-FSDP forces.
    fsdp = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"]
    for argv, grads, weights in (
            ([], False, False), (["--overlap-grad-reduce"], True, False),
            (["--lgs"], True, False),
            (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
             True, True),
            ([*fsdp, "optim_grads"], True, False),
            ([*fsdp, "optim_grads", "--overlap-param-gather"], True, True),
            ([*fsdp, "optim_grads_params"], True, True)):
        cfg = config_from_namespace(build_parser().parse_args(argv), 8)
        layout = trainer_run_fields(cfg, 8)[1]
        assert (layout["overlap_grad_reduce"], layout["overlap_param_gather"]) == \
            (grads, weights), argv


def test_an_output_that_cannot_be_written_is_refused_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The benches' and the planner's --json: asked before the work, leaving no file behind
    and an existing one as it was."""
    from megatron_lgs.value_checks import unwritable_file

    sys.path.insert(0, str(ROOT / "bench"))
    from published_runs import main

    kept = tmp_path / "kept.json"
    kept.write_text("[1]")
    assert unwritable_file(kept) is None and kept.read_text() == "[1]"
    assert unwritable_file(tmp_path / "new.json") is None and not (tmp_path / "new.json").exists()
    assert unwritable_file(tmp_path) == "Is a directory"
    assert unwritable_file(tmp_path / "no" / "x.json") == "No such file or directory"
    with pytest.raises(SystemExit) as exc:
        main(["--json", str(tmp_path)])
    err = capsys.readouterr()
    assert exc.value.code == 2 and f"argument --json: {tmp_path}: Is a directory" in err.err
    assert "PREDICTION" not in err.out


def _own_config(tmp_path: Path, extra: str) -> str:
    """A user's launch config beside none of launch/configs/: gpt-10b.sh plus `extra`."""
    text = (ROOT / "launch/configs/gpt-10b.sh").read_text().replace("--bf16", f"--bf16 {extra}")
    path = tmp_path / "my-model.sh"
    path.write_text(text)
    return str(path)


def test_planner_takes_a_users_config_in_its_own_precision(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """A config outside launch/configs/ is read at the GPU count asked for, and planned in its
    precision: FP8 with the trainer's recipe, refused in one line on a GPU without FP8."""
    for extra, recipe in (("--fp8-format hybrid", "delayed"),
                          ("--fp8-format hybrid --fp8-recipe tensorwise", "current")):
        base, ref = resolve(_own_config(tmp_path, extra), "h100-sxm", 16, None, None)
        assert (base.precision, base.fp8_recipe, base.fp8_params) == ("fp8", recipe, False)
        assert ref is not None and (ref.tp, ref.pp, ref.dp) == (4, 2, 2)
    plain, _ = resolve(_own_config(tmp_path, ""), "h100-sxm", 16, None, None)
    assert plain.precision == "bf16"
    assert predict_run(replace(ref, precision="fp8")).step_time_s < \
        predict_run(replace(ref, precision="bf16")).step_time_s
    for gpu, extra, said in (("a100-80gb", "--fp8-format hybrid", "has no tensor cores for"),
                             ("h100-sxm", "--fp8-format hybrid --fp8-recipe blockwise",
                              "--fp8-recipe blockwise")):
        with pytest.raises(SystemExit) as exc:
            plan_main(["--model", _own_config(tmp_path, extra), "--gpus", "16", "--hardware",
                       gpu])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and said in err[0], err


@pytest.mark.parametrize("run", [DENSE, MOE], ids=["dense", "moe"])
def test_stage_tensor_limit_counts_the_tensors_the_replay_builds(run: dict) -> None:
    """`runspec`'s limit on a stage's weight tensors counts what `workload` builds per layer."""
    r = run_from_dict(run)
    w = sync_workload(r, link_profile(GPUS[r.gpu]))
    layers = r.num_layers // r.pp
    ops = stage_backward(w.model, w.layout, 1)  # the last stage; its loss has no tensors here
    built = sum(len(op.grads) for op in ops if op.name.startswith("layer"))
    assert built == layers * stage_tensors_per_layer(r)


def test_planner_says_whether_a_missing_layout_did_not_fit_or_does_not_exist() -> None:
    """An answer without a layout of one kind says why: refused for memory (the 100B without
    model parallelism), none divides the model (the 10B's 40 heads take no TP16), or all the
    GPUs share a node (no TP crosses one)."""
    cases = (("gpt-100b", "a100-80gb", 128, 512,
              "ZeRO-2 vs ZeRO-3 (pure data parallel): no ZeRO-2 layout fits in memory"),
             ("gpt-10b", "a100-40gb", 16, None,
              "TP inside a node (<= 8) vs across: no across layout divides this model, GPU "
              "count and global batch"),
             ("gpt-10b", "a100-40gb", 6, 6,
              "TP inside a node (<= 8) vs across: none crosses one, the 6 GPUs share a node"))
    for model, gpu, gpus, batch, said in cases:
        base, _ = resolve(model, gpu, gpus, batch, None)
        unfit: list = []
        cands = candidates(base, unfit)
        assert all(not fits(r) for r in unfit) and all(fits(c[2]) for c in cands), model
        assert said in questions(cands, best_of(cands, 1)[0], base, unfit), (model, gpus)


def test_planner_searches_share_their_predictions() -> None:
    """The questions' searches reuse the main search's predictions, and find what they find
    without them."""
    base, _ = resolve("launch/configs/gpt-100b-moe.sh", "h100-sxm", 32, None, None)
    cands = candidates(base)
    known: dict = {}
    best = best_of(cands, 3, known=known)
    replayed = len(known)
    assert best_of(cands, 1, known=known) == best[:1] and len(known) == replayed
    shared = questions(cands, best[0], base, known=known)
    assert len(known) > replayed and shared == questions(cands, best[0], base)
