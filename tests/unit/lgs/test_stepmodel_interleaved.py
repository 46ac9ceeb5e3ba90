"""Megatron-core's data-parallel sync under the interleaved schedule: per-chunk gradient
reductions spread over the cooldown, per-chunk chained parameter gathers in the warm-up."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from megatron_lgs.lgs import stepmodel
from megatron_lgs.lgs.costmodel import hierarchical_allreduce
from megatron_lgs.lgs.gpus import get_gpu, link_profile
from megatron_lgs.lgs.kernels import memory_time
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.stepmodel import (
    _gather_exposed,
    compute_phase,
    fp8_weight_cache,
    interleaved_fill_latency,
    p2p_time,
    predict_run,
    run_gpu,
    sync_workload,
)
from megatron_lgs.lgs.timeline import ONE_BUCKET, Thresholds, replay
from megatron_lgs.lgs.workload import chunk_backward, stage_backward, stage_numel

H100 = get_gpu("h100-sxm")
BASE = {"id": "v", "gpu": "h100-sxm", "num_gpus": 256, "num_layers": 16, "hidden": 4096,
        "heads": 32, "vocab": 32000, "seq_length": 2048, "tp": 8, "pp": 2, "vpp": 4,
        "micro_batch": 1, "global_batch": 256, "distributed_optimizer": True}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def _layers(ops) -> list[int]:
    return sorted({int(op.name.split(".")[0][5:]) for op in ops if op.name.startswith("layer")})


def test_chunks_hold_megatrons_interleaved_layers() -> None:
    r = run()
    w = sync_workload(r, link_profile(H100))
    # 16 layers, pp 2, vpp 4: 2 layers a chunk; stage 0 holds chunks 0, 2, 4, 6 of the model.
    chunks = chunk_backward(w.model, w.layout, 0, 4)
    assert [_layers(c) for c in chunks] == [[12, 13], [8, 9], [4, 5], [0, 1]]
    assert chunks[-1][-1].name == "embedding" and chunks[0][0].name != "output"
    last = chunk_backward(w.model, w.layout, 1, 4)
    assert [_layers(c) for c in last] == [[14, 15], [10, 11], [6, 7], [2, 3]]
    assert last[0][0].name == "output"
    for k in range(2):
        whole = stage_numel(stage_backward(w.model, w.layout, k))
        parts = [stage_numel(c) for c in chunk_backward(w.model, w.layout, k, 4)]
        assert sum(p["dense"] for p in parts) == whole["dense"]


def test_each_chunk_syncs_after_its_last_backward_by_hand() -> None:
    """Stage 0, vpp 4, pp 2: chunk c's last backward ends c * pp * tb / vpp before the stage's
    last; later chunks are one bucket each, reduced one after another on one channel."""
    r = run()
    hw = link_profile(H100)
    w = sync_workload(r, hw)
    tf, tb, end = [0.4, 0.4], [0.8, 0.8], 10.0
    th = Thresholds(1 << 62, 1 << 62)
    pred = replay(w, th, tf, tb, end, bucket_later_stages=False, pipelined_hops=False, vpp=4)
    s0 = pred.stages[0]
    g, m = w.layout.group_shape("dense")
    step = tb[0] / 4
    free = beside = 0.0
    for i, c in enumerate(chunk_backward(w.model, w.layout, 0, 4)):
        chunk = 3 - i
        ready = end - chunk * 2 * step
        nbytes = stage_numel(c)["dense"] * w.layout.grad_bytes
        cost = hierarchical_allreduce(nbytes, g, m, hw, ONE_BUCKET.inter_bytes, all_gather=False)
        start = max(ready, free)
        free = start + cost.intra_s + cost.inter_s
        beside += max(0.0, min(free, end) - start)
        bucket = s0.buckets[i]
        assert bucket.ready_s == pytest.approx(ready)
        assert bucket.end_s == pytest.approx(free)
    # The backward beside each reduction runs on the 116 of 132 SMs NCCL leaves it.
    assert beside > 0
    assert s0.synced_s == pytest.approx(max(end, free) + beside * 16 / 132)
    # Stage 1's final backward ends tb_0 / vpp before the step's compute does.
    assert pred.stages[1].backward_end_s == pytest.approx(end - tb[0] / 4)


def test_interleaving_hides_more_of_the_sync_than_one_window() -> None:
    """The same stage times: spreading the chunks' reductions over the cooldown never leaves
    more exposed than reducing the whole stage after its last micro-batch's backward."""
    r = run()
    w = sync_workload(r, link_profile(H100))
    th = Thresholds(40_000_000 * 4, 40_000_000 * 4)
    for tb in ([0.05, 0.05], [0.4, 0.4], [2.0, 2.0]):
        tf = [t / 2 for t in tb]
        one = replay(w, th, tf, tb, 20.0, bucket_later_stages=False, vpp=1)
        inter = replay(w, th, tf, tb, 20.0, bucket_later_stages=False, vpp=4)
        assert inter.exposed_comm_s <= one.exposed_comm_s + 1e-12


def test_chained_param_gather_by_hand() -> None:
    """The first bucket's gather is exposed, the rest of chunk 0's hides behind its first
    forward (fwd / vpp), every later chunk's behind the pp warm-up forwards of the chunk before
    it (pp * fwd / vpp)."""
    r = run()
    w = sync_workload(r, link_profile(H100))
    gather, fwd, first = 0.8, 0.4, 0.01
    shares = [stage_numel(c)["dense"] for c in chunk_backward(w.model, w.layout, 0, 4)[::-1]]
    total, step = sum(shares), fwd / 4
    want = first + max(0.0, gather * shares[0] / total - first - step)
    want += sum(max(0.0, gather * n / total - 2 * step) for n in shares[1:])
    assert _gather_exposed(r, w, 0, gather, fwd, first) == pytest.approx(want)
    flat = replace(r, vpp=1)
    assert _gather_exposed(flat, w, 0, gather, fwd, 0.0) == pytest.approx(gather - fwd)
    assert _gather_exposed(flat, w, 0, gather, fwd, first) == pytest.approx(gather - fwd)
    assert _gather_exposed(flat, w, 0, gather, 2 * gather, first) == pytest.approx(first)


def test_first_gather_bucket_by_hand() -> None:
    """Stage 0's first chunk (layers 0-1 and the embedding; TP8, hidden 4096) filled in backward
    order, one tensor at a time, into buckets of max(40M, 1M x DP 16) = 40M parameters: layer 1
    (25.17M) and layer 0's fc2 and fc1 weights close one at 41.95M; the MLP norm's weight (h),
    layer 0's proj (h^2 / 8), its qkv (3 h^2 / 8) with the attention norm's weight (h) and the
    embedding (32000 x 4096 / 8) are left: the bucket the forward reaches first."""
    r = run()
    w = sync_workload(r, link_profile(H100))
    h = 4096
    assert stepmodel._first_buckets(r, w, 0) == {
        "dense": h + h * h // 8 + 3 * h * h // 8 + h + 32000 * h // 8, "expert": 0.0}


def test_interleaved_layout_predicts_less_exposed_dp_traffic() -> None:
    est = predict_run(run())
    one = predict_run(run(vpp=1))
    exposed = est.breakdown["dp_grad_sync"] + est.breakdown["param_all_gather"]
    assert exposed < one.breakdown["dp_grad_sync"] + one.breakdown["param_all_gather"]
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)


def _megatron_order(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, chunk, micro-batch) order one stage runs, from megatron-core's own schedule
    table and warm-up count (`pipeline_parallel/schedules.py`)."""
    # Imported here: megatron_lgs patches megatron-core on import and must come first.
    from megatron.core.pipeline_parallel.schedules import (
        get_pp_rank_microbatches,
        get_schedule_table,
    )

    pg = SimpleNamespace(size=lambda: p, rank=lambda: rank)
    comm = SimpleNamespace(pp_group=pg, virtual_pipeline_model_parallel_size=v)
    total, _, warm, _ = get_pp_rank_microbatches(m, v, p, p2p_communicator=comm)
    table = get_schedule_table(m, v, p)
    fwd = [("F", chunk, mb) for mb, chunk in table]
    bwd = [("B", v - 1 - chunk, mb) for mb, chunk in table]
    order = fwd[:warm]
    for i in range(total - warm):
        order += [fwd[warm + i], bwd[i]]
    return order + bwd[total - warm:]


def _makespan(p: int, v: int, m: int, f: float, b: float, send: float,
              first: float = 0.0) -> float:
    """Every stage runs its order; an op waits for its input, one send away when it comes from
    another stage (a forward from the stage before, or round from the last stage to the next
    chunk of stage 0; a backward the mirror of that). Micro-batch 0's forwards take `first`
    longer (each chunk's FP8 weight cache)."""
    orders = [_megatron_order(p, v, m, s) for s in range(p)]
    done: dict[tuple[int, str, int, int], float] = {}
    pos, clock = [0] * p, [0.0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, j, mb = orders[s][pos[s]]
                if kind == "F":
                    dep = (s - 1, "F", j, mb) if s else ((p - 1, "F", j - 1, mb) if j else None)
                    lag = send
                elif s < p - 1:
                    dep, lag = (s + 1, "B", j, mb), send
                elif j < v - 1:
                    dep, lag = (0, "B", j + 1, mb), send
                else:
                    dep, lag = (s, "F", j, mb), 0.0
                if dep is not None and dep not in done:
                    break
                start = max(clock[s], done[dep] + lag if dep else 0.0)
                took = (f + (first if mb == 0 else 0.0)) if kind == "F" else b
                clock[s] = done[(s, kind, j, mb)] = start + took
                pos[s] += 1
                moved = True
        assert moved, "the order deadlocks"
    return max(clock)


@pytest.mark.parametrize("pp,vpp,m", [(4, 3, 8), (4, 3, 16), (8, 12, 8), (2, 42, 8)])
def test_interleaved_fill_latency_is_what_megatrons_order_waits(pp: int, vpp: int,
                                                                 m: int) -> None:
    """Replayed event by event in megatron-core's interleaved order, overlapped sends lengthen
    the step by exactly the model's fill latency, whatever the micro-batch count."""
    r = run(pp=pp, vpp=vpp, num_layers=pp * vpp * 2, global_batch=m * 256 // (8 * pp))
    assert r.num_micro_batches == m
    hw = link_profile(H100)
    send = p2p_time(r, hw)
    f, b = 3 * send, 6 * send  # a chunk's compute hides a send in the steady state
    waited = _makespan(pp, vpp, m, f, b, send) - _makespan(pp, vpp, m, f, b, 0.0)
    assert interleaved_fill_latency(r, hw) == pytest.approx(waited)
    assert interleaved_fill_latency(replace(r, overlap_p2p_comm=False), hw) == 0.0
    assert interleaved_fill_latency(replace(r, vpp=1, num_layers=pp * 2), hw) == 0.0


def test_compute_end_carries_the_fill_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    r = run(pp=4, vpp=2, global_batch=256)
    hw = link_profile(H100)
    end = compute_phase(r, hw)[1]
    monkeypatch.setattr(stepmodel, "interleaved_fill_latency", lambda r, hw: 0.0)
    assert end - compute_phase(r, hw)[1] == pytest.approx(
        2 * (1 * 4 + 3) * p2p_time(r, hw))


@pytest.mark.parametrize("pp,vpp,m,fp8_params", [(4, 3, 8, False), (8, 1, 16, True),
                                                 (8, 12, 8, False)])
def test_fp8_weight_cache_is_what_the_first_micro_batch_carries(pp: int, vpp: int, m: int,
                                                                 fp8_params: bool) -> None:
    """Each chunk's first forward of a step makes its FP8 weight cache: replayed in
    megatron-core's order, the step grows by the model's term; by hand, the layers' GEMM
    weights at 4 B an element (cast and transpose, delayed scaling) or 2 B (FP8 parameters,
    transposed only)."""
    r = run(pp=pp, vpp=vpp, num_layers=pp * vpp * 2, global_batch=m * 256 // (8 * pp),
            precision="fp8", fp8_params=fp8_params)
    gpu = run_gpu(r)
    cache = fp8_weight_cache(r, gpu)
    weights = 2 * (4096 * 3 * 4096 + 4096 * 4096 + 2 * 4096 * 4 * 4096) / 8  # 2 layers a chunk
    chunk = memory_time(weights * (2.0 if fp8_params else 4.0), gpu)
    assert cache == pytest.approx(pp * vpp * chunk)
    f, b = 10 * chunk, 20 * chunk
    assert _makespan(pp, vpp, m, f, b, 0.0, first=chunk) - _makespan(pp, vpp, m, f, b, 0.0) \
        == pytest.approx(cache)
    assert fp8_weight_cache(replace(r, precision="bf16"), gpu) == 0.0
