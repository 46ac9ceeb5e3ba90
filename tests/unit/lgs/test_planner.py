"""The layout planner (`plan_run`): the seed's 100B case and launch/configs/gpt-10b.sh, what it
searches, its flag lines through the trainer's validation, its answers, its JSON and its
one-line errors (a user's own configs: test_planner_configs.py; `simulate predict`:
test_predict.py)."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron_lgs.arguments import build_parser, config_from_namespace
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
    Plan,
    best_of,
    candidates,
    fits,
    layouts,
    memory,
    model_flags,
    with_thresholds,
)
from megatron_lgs.lgs.predict import predict_file
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.stepmodel import predict_run
from megatron_lgs.validation import validate

ROOT = Path(__file__).resolve().parents[3]


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
    for a, b, gain in re.findall(r"^answer: .* (\d+\.\d+) s vs .* (\d+\.\d+) s: \S+ ([^;\n]*)",
                                 out, re.MULTILINE):
        ratio = max(float(a), float(b)) / min(float(a), float(b))
        # A gain under 2x as a percentage, from 2x as a ratio (the 100B's TP16: 4.21x).
        if m := re.fullmatch(r"(\d+\.\d\d)x faster", gain):
            assert ratio >= 1.99 and float(m[1]) == pytest.approx(ratio, abs=0.01), (gain, a, b)
        else:
            m = re.fullmatch(r"faster by (\d+\.\d)%", gain)
            assert m and ratio < 2.01, (gain, a, b)
            assert float(m[1]) / 100 == pytest.approx(ratio - 1, abs=0.002), (gain, a, b)
    assert model != "gpt-100b" or re.search(r"across: inside .*: inside \d\.\d\dx faster", out)


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


def test_the_gelu_the_plan_times_is_the_one_the_trainer_runs() -> None:
    """The trainer fuses a GELU MLP's bias add only for the tanh GELU (`--openai-gelu`): a
    plan that timed the fused kernel asks for it on its flag line, and a trainer config's
    exact GELU with biases is timed with the bias added apart."""
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.lgs.plan_models import trainer_run_fields

    fused = run_from_dict({"id": "g", "gpu": "a100-80gb", "num_gpus": 8, "num_layers": 4,
                           "hidden": 1024, "heads": 16, "vocab": 32000, "seq_length": 2048,
                           "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8})
    assert "--openai-gelu" in model_flags(fused)
    assert "--openai-gelu" not in model_flags(replace(fused, bias_gelu_fusion=False))
    from megatron_lgs.model import mlp_activation

    tiny = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"]
    for flags, want in (([], False), (["--openai-gelu"], True),
                        (["--disable-bias-linear"], True), (["--swiglu"], True)):
        cfg = parse_args([*tiny, *flags], world_size=1)
        assert trainer_run_fields(cfg, 8)[0]["bias_gelu_fusion"] is want, flags
        # What the trainer builds on a GPU: a bias added apart exactly where it does not fuse.
        m = cfg.model
        apart = m.add_bias_linear and not m.swiglu and not mlp_activation(m, on_gpu=True)[1]
        assert apart is not want, flags


@pytest.mark.parametrize("model,gpus,gpu", [("launch/configs/gpt-10b.sh", 64, "h100-sxm"),
                                            ("gpt-100b", 128, "a100-80gb"),
                                            ("gpt-100b-moe", 128, "h100-sxm")])
def test_planner_flag_lines_pass_the_trainers_validation(model: str, gpus: int,
                                                         gpu: str) -> None:
    base, _ = resolve(model, gpu, gpus, None, None)
    cands = candidates(base)
    seen, known = set(), {}
    for kind, where in KINDS.items():
        for est in best_of(cands, 1, where, known):
            seen.add(kind)
            plan = with_thresholds(est, [64])
            argv = best_flags(model, base, plan).split()
            validate(config_from_namespace(build_parser().parse_args(argv), gpus))
            assert ("--lgs" in argv) == (est.run.zero < 2), (kind, argv)
            assert ("--overlap-moe-expert-parallel-comm" in argv) == est.run.moe_a2a_overlap
    assert set(KINDS) - {"ZeRO-2", "EP", "ETP1", "A2A overlap"} <= seen  # ZeRO-2: the 10B only
    moe = {"EP", "ETP1", "A2A overlap"}
    assert moe <= seen if base.num_experts else not moe & seen


@pytest.mark.parametrize("model,gpus,gpu", [("gpt-100b-moe", 128, "h100-sxm"),
                                            ("gpt-100b", 128, "a100-80gb"),
                                            ("launch/configs/gpt-10b.sh", 64, "h100-sxm")])
def test_every_layout_searched_is_one_the_trainer_runs(model: str, gpus: int, gpu: str) -> None:
    """Each distinct parallel layout the planner searches writes a flag line the trainer's
    validation accepts. For MoE that includes expert layouts folded over a stage's TP x CP x DP
    ranks (EP across TP ranks where the experts are not split over TP), as megatron-core runs
    them: until 2026-12-07 the trainer refused 70 of the 505 for the MoE preset on 128 GPUs (EP
    x TP x PP had to divide the world)."""
    base, _ = resolve(model, gpu, gpus, None, None)
    seen = {}
    for r in layouts(base):
        seen.setdefault((r.tp, r.pp, r.cp, r.ep, r.etp, r.vpp, r.zero), r)
    assert len(seen) > 100
    if base.num_experts:
        assert [r for r in seen.values() if gpus % (r.ep * r.tp * r.pp)]  # folded ones
    for r in seen.values():
        # The flag line reads only the plan's run: no prediction is needed to write it.
        argv = best_flags(model, base, Plan(SimpleNamespace(run=r), None, 0.0, None)).split()
        validate(config_from_namespace(build_parser().parse_args(argv), gpus))


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


def test_planner_takes_the_nodes_size(capsys: pytest.CaptureFixture) -> None:
    """Nodes of 4 (an A100 cluster such as Perlmutter's): TP 8 leaves the node and pays for it."""
    plan_main(["--model", "launch/configs/gpt-10b.sh", "--gpus", "16", "--hardware",
               "a100-40gb", "--gpus-per-node", "4", "--top", "1"])
    out = capsys.readouterr().out
    assert "16 x a100-40gb (4 a node)" in out, out
    assert re.search(r"TP inside a node \(<= 4\) vs across: inside .* vs across TP8 .*: inside "
                     r"(faster by|\d+\.\d\dx faster)", out), out
    base, _ = resolve("launch/configs/gpt-10b.sh", "a100-40gb", 16, None, None,
                      gpus_per_node=4)
    tp8 = replace(base, tp=8, etp=8, dp=2, sequence_parallel=True)
    in_nodes_of_8 = predict_run(replace(tp8, gpus_per_node=8))
    in_nodes_of_4 = predict_run(tp8)
    assert in_nodes_of_4.breakdown["tp_comm"] > 2 * in_nodes_of_8.breakdown["tp_comm"]


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


def test_planner_says_how_far_a_model_is_from_fitting(capsys: pytest.CaptureFixture) -> None:
    """Where no layout fits, the one-line error names the layout that needs the least memory
    and how much: the 100B on 16 A100 needs more than a GPU has in every layout."""
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", "gpt-100b", "--gpus", "16", "--hardware", "a100-80gb",
                   "--global-batch", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    said = re.search(r"no layout fits in memory; the leanest, (.*), needs ([\d.]+) GB a GPU of "
                     r"the ([\d.]+) GB", err[0])
    assert said, err
    base, _ = resolve("gpt-100b", "a100-80gb", 16, 64, None)
    unfit: list = []
    assert candidates(base, unfit) == [] and unfit
    leanest = min(memory(r).peak_bytes for r in unfit)
    assert float(said.group(2)) == round(leanest / 1e9, 1) > float(said.group(3))
