"""`simulate predict RUNS.json`: its JSON lines, the fields it ignored or read from the run,
and its one-line errors (the planner: test_planner.py; the published-runs table:
test_published_runs.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from megatron_lgs.lgs.gpus import GPUS, link_profile
from megatron_lgs.lgs.layercost import TERMS
from megatron_lgs.lgs.predict import predict_file
from megatron_lgs.lgs.runcheck import stage_tensors_per_layer
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.simulate import cli
from megatron_lgs.lgs.stepmodel import predict_run, sync_workload
from megatron_lgs.lgs.workload import stage_backward

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
         "p2p_scatter_gather": True, "nic_gbit_per_gpu": 25.0, "bias_gelu_fusion": False}


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
    gelu = {**acting, "swiglu": False}  # a GELU MLP, whose bias add the fusion takes in
    assert predict_run(run_from_dict({**gelu, "bias_gelu_fusion": False})).step_time_s > \
        predict_run(run_from_dict(gelu)).step_time_s


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



@pytest.mark.parametrize("run", [DENSE, MOE], ids=["dense", "moe"])
def test_stage_tensor_limit_counts_the_tensors_the_replay_builds(run: dict) -> None:
    """`runspec`'s limit on a stage's weight tensors counts what `workload` builds per layer."""
    r = run_from_dict(run)
    w = sync_workload(r, link_profile(GPUS[r.gpu]))
    layers = r.num_layers // r.pp
    ops = stage_backward(w.model, w.layout, 1)  # the last stage; its loss has no tensors here
    built = sum(len(op.grads) for op in ops if op.name.startswith("layer"))
    assert built == layers * stage_tensors_per_layer(r)
