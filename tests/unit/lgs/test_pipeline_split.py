"""Uneven pipeline splits: the model's layer counts per stage and chunk are megatron-core's own
(`get_num_layers_to_build`), a bad split is a one-line error naming the field, and the step
model and the gradient-sync workload follow the split."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from megatron_lgs.lgs.gpus import get_gpu, link_profile
from megatron_lgs.lgs.run_defaults import pipeline_split_for
from megatron_lgs.lgs.runspec import RunError, read_run, run_from_dict
from megatron_lgs.lgs.stepmemory import activation_bytes
from megatron_lgs.lgs.stepmodel import predict_run, stage_costs, stage_params, sync_workload
from megatron_lgs.lgs.workload import SplitError, layer_split, stage_backward, stage_numel

# isort: split
# megatron-core only after megatron_lgs, whose import installs the platform layer first.
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_block import get_num_layers_to_build

# (layers, pp, vpp, first, last, embedding, loss)
SPLITS = [(126, 8, 8, 0, 0, True, True), (126, 8, 1, 0, 0, True, True),
          (30, 4, 1, 6, 6, False, False), (30, 4, 2, 0, 6, False, False),
          (31, 4, 1, 7, 0, False, False), (24, 4, 2, 0, 0, False, False),
          (15, 4, 1, 0, 0, True, False), (15, 4, 1, 0, 0, False, True),
          (10, 2, 1, 4, 6, False, False), (30, 4, 1, 6, 0, False, False)]
BAD = [((31, 4, 1, 6, 0, False, False), "num_layers"),
       ((30, 4, 1, 0, 0, False, False), "num_layers"), ((24, 4, 4, 0, 0, False, False), "vpp"),
       ((30, 4, 1, 6, 6, True, False), "decoder_first_pipeline_num_layers")]


def megatron_split(layers, pp, vpp, first, last, embedding, loss) -> list[list[int]]:
    cfg = TransformerConfig(
        num_layers=layers, hidden_size=64, num_attention_heads=4, pipeline_dtype=torch.bfloat16,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        num_layers_in_first_pipeline_stage=first or None,
        num_layers_in_last_pipeline_stage=last or None,
        account_for_embedding_in_pipeline_split=embedding, account_for_loss_in_pipeline_split=loss)
    return [[get_num_layers_to_build(cfg, vp_stage=c if vpp > 1 else None, pp_rank=k)
             for c in range(vpp)] for k in range(pp)]


@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_split_is_megatron_cores(split) -> None:
    ours = layer_split(*split)
    assert ours == megatron_split(*split)
    assert sum(map(sum, ours)) == split[0]


@pytest.mark.parametrize(("split", "field"), BAD, ids=str)
def test_bad_split_is_refused_as_megatron_core_refuses_it(split, field) -> None:
    with pytest.raises(SplitError) as err:
        layer_split(*split)
    assert err.value.field == field
    with pytest.raises((AssertionError, ValueError)):
        megatron_split(*split)


RUN = {"id": "405b-like", "gpu": "h100-sxm", "num_gpus": 64, "num_layers": 14, "hidden": 2048,
       "heads": 16, "kv_heads": 8, "vocab": 32000, "seq_length": 4096, "tp": 2, "pp": 4, "vpp": 2,
       "micro_batch": 1, "global_batch": 64, "swiglu": True, "distributed_optimizer": True,
       "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def test_step_model_follows_the_split() -> None:
    r = run_from_dict(RUN)
    assert r.stage_layers == [3, 4, 4, 3]
    gpu = get_gpu(r.gpu)
    hw = link_profile(gpu)
    costs = stage_costs(r, gpu, hw)
    middle = costs[1].fwd["gemm"] / 4  # one layer's GEMMs
    assert costs[0].fwd["gemm"] == pytest.approx(3 * middle)
    assert costs[2].fwd["gemm"] == pytest.approx(4 * middle)
    assert costs[3].fwd["gemm"] > 3 * middle  # three layers and the output layer
    params = stage_params(r)
    w = sync_workload(r, hw)
    for k in range(r.pp):  # the replay's gradients are the step model's parameters
        assert sum(stage_numel(stage_backward(w.model, w.layout, k)).values()) == params[k][0]
    assert activation_bytes(r, 1) > activation_bytes(r, 2)  # as many layers, more in flight
    assert predict_run(r).step_time_s > 0
    even = replace(r, num_layers=16, account_for_embedding_in_pipeline_split=False,
                   account_for_loss_in_pipeline_split=False)
    assert even.stage_layers == [4, 4, 4, 4]


@pytest.mark.parametrize(("change", "field"), [
    ({"num_layers": 15}, "num_layers"),
    ({"decoder_first_pipeline_num_layers": 2}, "decoder_first_pipeline_num_layers"),
    ({"vpp": 3}, "vpp"),
    ({"decoder_last_pipeline_num_layers": 0}, "decoder_last_pipeline_num_layers")])
def test_bad_split_in_a_run_names_its_field(change, field) -> None:
    with pytest.raises(RunError) as err:
        run_from_dict({**RUN, **change})
    assert err.value.field == field and "\n" not in str(err.value)


def test_planner_counts_embedding_and_loss_where_only_that_divides_the_model() -> None:
    """14 layers cannot split over 8 or 16 stages evenly; with the embedding and the loss
    counted (16 units) 8 stages hold 1, 2, ..., 2, 1 layers. The planner proposes such
    layouts, never one with a chunk left without a layer, and the trainer takes their flags."""
    from megatron_lgs.arguments import build_parser, config_from_namespace
    from megatron_lgs.lgs.planner import layout_flags, layouts, model_flags, with_thresholds
    from megatron_lgs.validation import validate

    base = run_from_dict({**RUN, "num_gpus": 64, "tp": 1, "pp": 1, "vpp": None,
                          "account_for_embedding_in_pipeline_split": None,
                          "account_for_loss_in_pipeline_split": None})
    all_layouts = list(layouts(base))
    counted = [r for r in all_layouts if r.account_for_embedding_in_pipeline_split]
    assert {r.pp for r in counted} == {4, 8}  # 16 units: 16 stages would leave one empty
    assert all(r.num_layers % r.pp for r in counted)
    assert all(not r.account_for_embedding_in_pipeline_split for r in all_layouts
               if r.num_layers % r.pp == 0)
    assert all(min(map(min, r.layer_split())) >= 1 for r in all_layouts)
    for pp, vpp in ((8, 1), (4, 2)):
        r = next(r for r in counted if (r.pp, r.vpp, r.zero) == (pp, vpp, 1))
        argv = " ".join(model_flags(r) + layout_flags(
            with_thresholds(predict_run(r), [64]), r.global_batch)).split()
        assert "--account-for-loss-in-pipeline-split" in argv
        cfg = config_from_namespace(build_parser().parse_args(argv), r.num_gpus)
        validate(cfg)
        assert cfg.parallel.virtual_pipeline_size(cfg.model.num_layers) == (
            vpp if vpp > 1 else None)


# (layers, pp, vpp) of published models whose layers do not divide over their stages, and the
# split `predict` reads them with when the run gives none: Llama 3.1 405B on 8 stages of 8
# chunks, Qwen3-235B on 8 of 4, BLOOM on 12, a DeepSeek-V3-like 61 on 16, and an even model.
COUNTED = {"account_for_embedding_in_pipeline_split": True,
           "account_for_loss_in_pipeline_split": True}
INFERRED = [((126, 8, 8), COUNTED), ((94, 8, 4), COUNTED), ((70, 12, 1), COUNTED),
            ((127, 8, 1), {"account_for_loss_in_pipeline_split": True}),
            ((61, 16, 1), {"decoder_last_pipeline_num_layers": 1}),
            ((63, 12, 1), {"decoder_first_pipeline_num_layers": 1,
                           "decoder_last_pipeline_num_layers": 2}),
            ((70, 16, 1), {"decoder_first_pipeline_num_layers": 7,
                           "decoder_last_pipeline_num_layers": 7}), ((32, 4, 2), {})]


@pytest.mark.parametrize(("shape", "assumed"), INFERRED, ids=str)
def test_a_run_without_a_split_takes_one_megatron_core_accepts(shape, assumed) -> None:
    layers, pp, vpp = shape
    given = {**RUN, "num_layers": layers, "pp": pp, "vpp": vpp, "num_gpus": 2 * pp * 4,
             "global_batch": 64, "account_for_embedding_in_pipeline_split": None,
             "account_for_loss_in_pipeline_split": None}
    r, said = read_run(given)
    assert said == assumed
    assert r.layer_split() == megatron_split(layers, pp, vpp, r.decoder_first_pipeline_num_layers,
                                             r.decoder_last_pipeline_num_layers,
                                             r.account_for_embedding_in_pipeline_split,
                                             r.account_for_loss_in_pipeline_split)
    explicit = run_from_dict({**given, **assumed})
    assert predict_run(r).step_time_s == predict_run(explicit).step_time_s


def test_where_any_split_without_an_empty_stage_exists_one_is_found() -> None:
    """Every split megatron-core accepts (first and last stage sizes, the embedding and the
    loss counted) for small models: where one leaves no stage empty, `predict` finds a split."""
    for layers, pp, vpp in itertools.product(range(1, 49), (2, 3, 4, 8), (1, 2, 3)):
        try:
            pipeline_split_for(layers, pp, vpp)
            continue
        except SplitError:
            pass
        for first, last, embedding, loss in itertools.product(
                range(layers + 1), range(layers + 1), (False, True), (False, True)):
            if (first or last) and (embedding or loss):
                continue
            try:
                chunks = layer_split(layers, pp, vpp, first, last, embedding, loss)
            except SplitError:
                continue
            assert min(map(sum, chunks)) < 1, (layers, pp, vpp, first, last, embedding, loss)


def test_a_split_the_run_gives_is_not_second_guessed() -> None:
    """A run that sets a split field keeps it, and is refused where it does not fit; a model
    no split fits is refused naming num_layers."""
    given = {**RUN, "num_layers": 126, "pp": 8, "vpp": 8, "num_gpus": 64,
             "account_for_embedding_in_pipeline_split": False,
             "account_for_loss_in_pipeline_split": None}
    with pytest.raises(RunError) as err:
        run_from_dict(given)
    assert err.value.field == "num_layers"
    with pytest.raises(RunError) as err:  # 7 layers on 16 stages: no split megatron-core takes
        run_from_dict({**given, "num_layers": 7, "pp": 16, "vpp": None,
                       "account_for_embedding_in_pipeline_split": None})
    assert err.value.field == "num_layers"


def test_a_stage_holding_only_the_embedding_syncs_after_its_backward() -> None:
    """Two layers on four stages: the first holds only the embedding, whose gradient (a
    scatter-add, no FLOPs) is ready when that stage's last backward ends, so the step ends no
    sooner than the compute does and its terms sum to it (the replay had it ready when that
    backward started, and the step 22 ms before the compute's end)."""
    r = run_from_dict({**RUN, "id": "empty-first", "num_layers": 2, "vpp": None,
                       "num_gpus": 32, "global_batch": 64})
    assert r.layer_split() == [[0], [1], [1], [0]]
    est = predict_run(r)
    first = est.sync.stages[0]
    assert first.backward_end_s == pytest.approx(est.sync.compute_end_s)
    assert all(b.ready_s >= first.backward_end_s for b in first.buckets)
    assert est.sync.step_time_s >= est.sync.compute_end_s
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-12)
