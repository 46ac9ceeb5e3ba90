"""Calibration probe: the cost model's constants measured on the machine at hand, in seconds.

Collective over the job's data-parallel group, seen as nodes x ranks the way the LGS engine
sees it (`sync.build_levels`). It measures, with the collectives the engine runs:

- each level's latency and bus bandwidth: reduce-scatters of a few sizes inside every node at
  once, then across nodes at once (the ranks of a node share its link, as in a real step),
  fitted to the ring formula t = (p-1) alpha + (p-1)/p n / B (`fit_link`);
- the forward+backward time of a one-layer GPT of the run's own shape (megatron-core's model,
  the run's config), which gives the FLOP rate this rank reaches and so the backward time per
  layer;
- how much communication slows that compute when both run at once, per level (`overlap` for
  the inter-node hop, `intra_overlap` for the intra-node one: 1 where they do not compete, as
  on a GPU; near 0 where they share saturated cores).

Every time is the slowest rank's (a collective ends when its last rank does) and the median
of a few repetitions. `--lgs-hardware measured` runs this at start-up; under torchrun,

    python -m megatron_lgs.lgs.calibrate --out profile.json [trainer flags]

saves it for `--lgs-hardware profile.json`.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_lgs.lgs.costmodel import HardwareProfile, Link
from megatron_lgs.lgs.hardware import save_profile
from megatron_lgs.lgs.topology import Levels, build_levels, reduce_scatter
from megatron_lgs.lgs.workload import layer_backward_flops, stage_backward

KB = 1 << 10
MB = 1 << 20
INTRA_SIZES = (64 * KB, 1 * MB, 8 * MB)  # reduce-scatter input bytes per rank
INTER_SIZES = (64 * KB, 512 * KB, 4 * MB)


@dataclass(frozen=True)
class ProbeConfig:
    intra_sizes: tuple[int, ...] = INTRA_SIZES
    inter_sizes: tuple[int, ...] = INTER_SIZES
    repeats: int = 3  # timed repetitions per size, after one warm-up
    compute_repeats: int = 5
    overlap_repeats: int = 5


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _time_once(fn: Callable[[], None]) -> float:
    """The slowest rank's time of one call of `fn`, all ranks starting together."""
    dist.barrier()
    started = time.perf_counter()
    fn()
    return _slowest(time.perf_counter() - started)


def _timed(fn: Callable[[], None], repeats: int) -> float:
    """Median over repetitions of `_time_once`, after one warm-up call."""
    fn()
    return statistics.median(_time_once(fn) for _ in range(repeats))


def fit_link(samples: list[tuple[int, float]], p: int) -> Link:
    """Alpha and bus bandwidth of t = (p-1) alpha + (p-1)/p n / B, from the line through the
    smallest and the largest message (Hockney's method: latency is what the smallest pays,
    bandwidth what the largest sustains).

    A least-squares line through all sizes is what the largest message decides, and a link
    that is faster for mid-size messages than for large ones (a token bucket's burst, as the
    emulated cluster's `tbf` has) pulls its intercept below zero, so the latency came out 0
    and small messages looked free. A negative intercept here (noise on the smallest message)
    is still clamped to zero latency, the slope then taken through the origin."""
    if p < 2 or len(samples) < 2:
        raise ValueError(f"need a group of >= 2 ranks and >= 2 sizes, got p={p}, "
                         f"{len(samples)} sizes")
    (n0, t0), (n1, t1) = min(samples), max(samples)
    x0, x1 = (p - 1) / p * n0, (p - 1) / p * n1
    slope = (t1 - t0) / (x1 - x0) if x1 > x0 else 0.0
    intercept = t0 - slope * x0
    if intercept < 0 or slope <= 0:
        slope, intercept = t1 / x1, 0.0
    return Link(alpha_s=intercept / (p - 1), bandwidth_Bps=1.0 / slope)


def probe_level(group: dist.ProcessGroup | None, p: int, sizes: tuple[int, ...],
                repeats: int, all_to_all: bool = False) -> list[tuple[int, float]]:
    """(bytes, seconds) of reduce-scatters over `group`, run by every rank at once (ranks
    outside such a group only take part in the timing's barriers)."""
    out = []
    for n in sizes:
        numel = max(p, n // 4 // p * p)
        if group is None:
            def fn() -> None:
                return None
        else:
            src = torch.ones(numel, dtype=torch.float32)
            dst = torch.empty(numel // p, dtype=torch.float32)

            def fn(src=src, dst=dst) -> None:
                reduce_scatter(dst, src, group, all_to_all=all_to_all)
        out.append((4 * numel, _timed(fn, repeats)))
    return out


class _ProbeModel:
    """A one-layer GPT of the run's shape (embedding, one megatron-core transformer layer,
    output layer, loss: every kind of op the run has) and one micro-batch for it."""

    def __init__(self, cfg, platform) -> None:
        from megatron_lgs.model import build_model

        self.platform = platform
        self.model = build_model(probe_config(cfg), platform, cfg.data.vocab_size)
        m, t = cfg.model, cfg.training
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, cfg.data.vocab_size, (t.micro_batch_size,
                                                             m.seq_length + 1),
                                    generator=g).to(platform.device)
        self.position_ids = torch.arange(m.seq_length, device=platform.device).expand(
            t.micro_batch_size, m.seq_length)

    def step(self) -> None:
        out = self.model(self.tokens[:, :-1], self.position_ids, None,
                         labels=self.tokens[:, 1:])
        out.float().mean().backward()
        if self.platform.is_cuda:
            torch.cuda.synchronize()


def probe_config(cfg):
    """The run's config cut to one layer on one pipeline stage (what the probe builds)."""
    par = replace(cfg.parallel, pipeline_model_parallel_size=1,
                  num_layers_per_virtual_pipeline_stage=None,
                  decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
                  account_for_embedding_in_pipeline_split=False,
                  account_for_loss_in_pipeline_split=False)
    return replace(cfg, model=replace(cfg.model, num_layers=1), parallel=par)


def probe_overlap(compute: Callable[[], None], comm: Callable[[], None], repeats: int,
                  comm_thread_setup: Callable[[], None] | None = None) -> float:
    """How much of the communication runs beside compute without slowing it: both at once
    (the collectives on a thread, as LGS runs them), against each alone. 1: the pair takes
    as long as the longer one; 0: as long as both in turn.

    Each repetition times compute alone, communication alone and both, so that a drift of
    the machine's load between them moves all three; the median of the repetitions' ratios
    is the answer. `comm_thread_setup` runs first on the communication thread (a caller whose
    communication threads run at another priority gives the probe's the same)."""

    def on_thread() -> None:
        if comm_thread_setup is not None:
            comm_thread_setup()
        comm()

    def both() -> None:
        thread = threading.Thread(target=on_thread)
        thread.start()
        compute()
        thread.join()

    def comm_alone() -> None:
        thread = threading.Thread(target=on_thread)
        thread.start()
        thread.join()

    samples = []
    for _ in range(repeats):
        compute_s, comm_s, wall = _time_once(compute), _time_once(comm_alone), _time_once(both)
        samples.append((compute_s + comm_s - wall) / min(compute_s, comm_s))
    return min(1.0, max(0.0, statistics.median(samples)))


def _memory_bytes(platform, per_node: int) -> float:
    if platform.is_cuda:
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    import psutil

    return float(psutil.virtual_memory().total) / per_node


def measure_profile(cfg, platform, levels: Levels, probe: ProbeConfig = ProbeConfig(),
                    name: str = "measured",
                    comm_thread_setup: Callable[[], None] | None = None
                    ) -> tuple[HardwareProfile, dict]:
    """Probe this job's links and compute; returns the profile and the raw samples.
    `comm_thread_setup`: see `probe_overlap`."""
    from megatron_lgs.lgs.recommend import workload_for_config

    if cfg.parallel.pipeline_model_parallel_size > 1:
        raise ValueError("the calibration probe builds a one-stage model: run it without "
                         "pipeline parallelism")
    started = time.perf_counter()
    g, m = levels.per_node, levels.nodes
    a2a = cfg.optim.reduce_scatter_with_fp32_accumulation  # the reduce-scatter the run uses
    intra = probe_level(levels.intra, g, probe.intra_sizes, probe.repeats, a2a) if g > 1 else []
    inter = probe_level(levels.inter, m, probe.inter_sizes, probe.repeats, a2a) if m > 1 else []
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    # The probe's dropout draws must not move the run's random streams.
    tracker = get_cuda_rng_tracker()
    cpu_state, tracker_states = torch.get_rng_state(), tracker.get_states()
    try:
        probe_model = _ProbeModel(cfg, platform)
        step_s = _timed(probe_model.step, probe.compute_repeats)

        # Each level's largest collective, repeated to last about one compute step: the
        # levels can differ (a hop that waits on a wire beside one that is CPU work).
        def level_overlap(group, p: int, sample: tuple[int, float]) -> float:
            n, t_one = sample
            k = max(1, round(step_s / t_one))
            src, dst = torch.ones(n // 4), torch.empty(n // 4 // p)

            def comm() -> None:
                for _ in range(k):
                    reduce_scatter(dst, src, group, all_to_all=a2a)

            return probe_overlap(probe_model.step, comm, probe.overlap_repeats,
                                 comm_thread_setup)

        intra_overlap = level_overlap(levels.intra, g, intra[-1]) if intra else None
        overlap = level_overlap(levels.inter, m, inter[-1]) if inter else None
        if overlap is None:  # one node: its only hop, if any, is the intra-node one
            overlap, intra_overlap = (1.0 if intra_overlap is None else intra_overlap), None
    finally:
        torch.set_rng_state(cpu_state)
        tracker.set_states(tracker_states)
    # The cost model's FLOPs of that one-layer model (forward = half of backward), so the rate
    # reproduces its measured time; a layer's backward then takes its FLOPs at that rate.
    w = workload_for_config(probe_config(cfg), g)
    ops = stage_backward(w.model, w.layout, 0)
    rate = 1.5 * sum(op.flops for op in ops) / step_s
    flops = layer_backward_flops(w.model, w.layout)
    backward_s = flops / rate
    intra_link = fit_link(intra, g) if intra else None
    inter_link = fit_link(inter, m) if inter else None
    # A level the job does not have carries no traffic; the other level's figures stand in.
    intra_link = intra_link or inter_link or Link(0.0, 1e12)
    inter_link = inter_link or intra_link
    hw = HardwareProfile(
        name=name, intra=intra_link, inter=inter_link, gpus_per_node=g,
        peak_flops=rate, memory_bytes=_memory_bytes(platform, g),
        source=f"calibration probe on {m} node(s) x {g} rank(s), "
               f"{platform.device if not platform.is_cuda else torch.cuda.get_device_name()}",
        efficiency=1.0, overlap=overlap, intra_overlap=intra_overlap)
    measurements = {
        "nodes": m, "ranks_per_node": g,
        "collective": "all_to_all + fp32 sum" if a2a else "reduce_scatter",
        "intra_samples": intra, "inter_samples": inter,
        "one_layer_gpt_step_s": step_s, "backward_s_per_layer": backward_s,
        "backward_flops_per_layer": flops,
        "layer_shape": {"hidden": cfg.model.hidden_size, "ffn": cfg.model.ffn_size,
                        "seq": cfg.model.seq_length, "micro_batch": cfg.training.micro_batch_size},
        "probe_seconds": time.perf_counter() - started,
    }
    return hw, measurements


def describe(hw: HardwareProfile, measurements: dict) -> str:
    def link(lk: Link) -> str:
        return f"alpha {lk.alpha_s * 1e6:.0f} us, bus bw {lk.bandwidth_Bps * 8 / 1e9:.2f} Gbit/s"

    return (f"calibration ({measurements['probe_seconds']:.1f} s): intra {link(hw.intra)}; "
            f"inter {link(hw.inter)}; backward {1e3 * measurements['backward_s_per_layer']:.1f} "
            f"ms/layer ({hw.peak_flops / 1e9:.1f} GFLOP/s); communication beside compute: "
            f"overlap {hw.overlap:.2f}"
            + (f" (intra-node {hw.intra_overlap:.2f})" if hw.intra_overlap is not None else ""))


def job_levels(cfg, per_node: int) -> Levels:
    """The dense data-parallel group of this rank as the engine sees it (collective)."""
    from megatron.core import parallel_state

    return build_levels([parallel_state.get_data_parallel_group(with_context_parallel=True)],
                        per_node)[0]


PROG = "python -m megatron_lgs.lgs.calibrate"


def main(argv: list[str] | None = None) -> None:
    from megatron_lgs import initialize
    from megatron_lgs.arguments import fail, parse_args
    from megatron_lgs.lgs.topology import gpus_per_node
    from megatron_lgs.platform import get_platform
    from megatron_lgs.value_checks import unwritable_file

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv or argv.index("--out") + 1 >= len(argv):
        fail("--out PROFILE.json is required; the other flags are the trainer's", PROG)
    i = argv.index("--out")
    out = argv[i + 1]
    del argv[i:i + 2]
    try:  # here, not after minutes of measuring
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--out {out}: {e.strerror}", PROG)
    if Path(out).is_dir():
        fail(f"--out {out} is a directory; give the profile's file name", PROG)
    # Rank 0 writes the profile; only it opens the file now (two ranks probing one path race).
    if os.environ.get("RANK", "0") == "0" and (why := unwritable_file(out)):
        fail(f"--out {out}: {why}", PROG)
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    platform = get_platform()
    cfg = parse_args(argv, prog=PROG)  # a bad flag: one line, exit 2
    initialize.init_distributed(cfg, platform)
    initialize.set_seeds(cfg.training.seed)  # the probe model's dropout needs the RNG tracker
    per_node, _ = gpus_per_node(cfg.lgs.lgs_gpus_per_node)
    hw, measurements = measure_profile(cfg, platform, job_levels(cfg, per_node))
    if dist.get_rank() == 0:
        save_profile(hw, out, measurements)
        print(describe(hw, measurements))
        print(f"wrote {out}")
    initialize.destroy()


if __name__ == "__main__":
    main()
