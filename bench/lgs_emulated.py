"""Shared by the LGS benchmarks on the emulated cluster (`launch/emulate_cluster.py`).

The driver side builds a 2-node cluster per link speed and runs the benchmark's own script on
every node under torchrun (`run_on_cluster`); the worker side (inside each rank) builds models
from trainer flags and times training steps (`Worker`). Every rank writes its samples to a JSON
file in a shared directory; the driver takes, per step, the slowest rank (a step is as slow as
its slowest rank), then medians. Two settings make the CPU cluster behave more like GPU nodes,
for every scheme alike: megatron-core's all-to-all reduce-scatter (`--ring-reduce-scatter` for
gloo's own) and real-time communication threads (`--no-comm-priority` to leave them be).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


# -- driver side --------------------------------------------------------------------------------
def run_on_cluster(script: Path, worker_args: list[str], *, gbit: float, nodes: int,
                   per_node: int, out: Path, timeout: float) -> float:
    """Run `script --worker ...` on an emulated cluster; returns the measured inter-node
    bandwidth (bit/s). Node logs go to out/node<i>.log; a failing node raises with its tail."""
    from launch.emulate_cluster import emulated_cluster

    out.mkdir(parents=True, exist_ok=True)
    torchrun = (f"exec {sys.executable} -m torch.distributed.run --nnodes $NNODES "
                f"--node-rank $NODE_RANK --nproc-per-node {per_node} --master-addr $MASTER_ADDR "
                f"--master-port $MASTER_PORT")
    command = " ".join([torchrun, str(script), "--worker", "--out", str(out),
                        *map(_quote, worker_args)])
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with emulated_cluster(nodes=nodes, gpus_per_node=per_node, inter_gbit=gbit) as cluster:
        measured = cluster.inter_bandwidth()
        print(f"# link set to {gbit:g} Gbit/s, measured {measured / 1e9:.3f} Gbit/s "
              f"(node0 -> node1)", flush=True)
        exits = cluster.run_on_nodes(["sh", "-c", command], env=env, log_dir=out,
                                     timeout=timeout, failure_timeout=30)
    if exits.status:
        tails = "\n".join(f"--- node{i}.log\n" + (out / f"node{i}.log").read_text()[-3000:]
                          for i in range(nodes))
        raise RuntimeError(f"the benchmark failed on the emulated cluster "
                           f"(exit {exits.status}):\n{tails}")
    return measured


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def read_ranks(out: Path) -> list[dict]:
    files = sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    return [json.loads(p.read_text()) for p in files]


def slowest_median(ranks: list[dict], key: str, field: int) -> float:
    """Median over steps of the slowest rank's `field` (0 step, 1 compute, 2 wait, 3 CPU)."""
    per_step = zip(*(r["times"][key] for r in ranks), strict=True)
    return statistics.median(max(s[field] for s in step) for step in per_step)


# -- worker side --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTime:
    step: float  # zero grads -> all micro-batches' forward/backward -> gradients synchronized
    compute: float  # until the last backward returned
    wait: float  # in finish_grad_sync
    cpu: float  # CPU time of every thread of this rank (training, communication, gloo's)


def _realtime(tid: int) -> None:
    """Real-time (FIFO) priority for thread `tid`, above every normal thread."""
    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))


class Worker:
    """One rank's models and batches; `flags` are trainer flags (Megatron-LM names)."""

    def __init__(self, flags: list[str], micro_batches: int, comm_priority: bool = True) -> None:
        import torch

        from megatron_lgs import initialize
        from megatron_lgs.arguments import parse_args
        from megatron_lgs.platform import get_platform

        self.torch = torch
        self.platform = get_platform()
        self.cfg = parse_args(flags)
        initialize.init_distributed(self.cfg, self.platform)
        initialize.set_seeds(self.cfg.training.seed)
        self.rank = torch.distributed.get_rank()
        self.micro_batches = micro_batches
        m, t = self.cfg.model, self.cfg.training
        g = torch.Generator().manual_seed(self.rank)
        self.batches = [torch.randint(0, self.cfg.data.vocab_size,
                                      (t.micro_batch_size, m.seq_length + 1), generator=g)
                        for _ in range(micro_batches)]
        self.position_ids = torch.arange(m.seq_length).expand(t.micro_batch_size, m.seq_length)
        self.comm_priority = comm_priority
        self._prioritized: set[int] = set()
        if comm_priority:  # before the calibration probe, which measures the same conditions
            self.prioritize_communication()

    def build(self, cfg, log=lambda _: None):
        from megatron_lgs import initialize
        from megatron_lgs.model import build_model
        from megatron_lgs.optim import wrap_ddp

        initialize.set_seeds(cfg.training.seed)
        [ddp] = wrap_ddp(cfg, [build_model(cfg, self.platform, cfg.data.vocab_size)], log=log)
        return ddp

    def build_two_level(self, cfg, instances: int):
        """megatron's two-level DDP (`num_distributed_optimizer_instances`). Its groups come from
        parallel_state, and with more than one instance megatron's DDP takes the *partial*
        data-parallel group for every model built while they are set; so they are set only
        for this build (a DDP keeps the groups it was built with) and then put back."""
        # megatron-core refuses its all-to-all reduce-scatter flag here, but the flag sets a
        # module global on the first DDP built with it, so (d) reduces the same way anyway.
        cfg = replace(cfg, optim=replace(cfg.optim, num_distributed_optimizer_instances=instances,
                                         reduce_scatter_with_fp32_accumulation=False))
        self._parallel_state(cfg)
        try:
            return self.build(cfg)
        finally:
            self._parallel_state(self.cfg)

    def _parallel_state(self, cfg) -> None:
        from megatron.core import parallel_state

        from megatron_lgs import initialize

        parallel_state.destroy_model_parallel()
        initialize.init_model_parallel(cfg)

    def step(self, ddp) -> tuple[StepTime, float]:
        """One step of `micro_batches` micro-batches (no_sync on all but the last, as
        megatron's schedule does); returns its times and the last micro-batch's loss."""
        if self.comm_priority:
            self.prioritize_communication()
        started, cpu = time.perf_counter(), time.process_time()
        ddp.zero_grad_buffer()
        for j, tokens in enumerate(self.batches):
            last = j == len(self.batches) - 1
            ctx = ddp.no_sync() if not last else _Null()
            with ctx:
                out = ddp(tokens[:, :-1], self.position_ids, None, labels=tokens[:, 1:])
                loss = out.float().mean()
                loss.backward()
        computed = time.perf_counter()
        ddp.finish_grad_sync()
        done = time.perf_counter()
        return (StepTime(done - started, computed - started, done - computed,
                         time.process_time() - cpu), loss.item())

    def calibrate(self, per_node: int):
        """The calibration probe on this job's groups, at the priority the steps run at: the
        groups are made first (each brings its own gloo threads) and raised with the rest, so
        the probe measures the conditions the schemes are timed in."""
        from megatron_lgs.lgs import calibrate

        levels = calibrate.job_levels(self.cfg, per_node)
        if self.comm_priority:
            self.prioritize_communication()
        return calibrate.measure_profile(self.cfg, self.platform, levels,
                                         comm_thread_setup=self.comm_thread_setup())

    def comm_thread_setup(self):
        """For the calibration probe's communication thread: the priority this rank's
        communication threads run at (None when they keep the normal one)."""
        if not self.comm_priority:
            return None
        return lambda: _realtime(0)  # 0: the calling thread

    def prioritize_communication(self) -> None:
        """Real-time priority for every thread of this rank but the training thread: gloo's
        workers and transport loop, LGS's communication thread. On a GPU node communication has
        its own engines (NIC DMA, a few SMs) and compute does not delay it; here four ranks'
        compute shares two cores and would starve it (a wake-up waits for a time slice).
        Threads that appear later (new groups, LGS's thread) are raised at the next step."""
        main = threading.get_native_id()
        for tid in map(int, os.listdir("/proc/self/task")):
            if tid == main or tid in self._prioritized:
                continue
            try:
                _realtime(tid)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
            self._prioritized.add(tid)

    def tune(self, ddp, cfg, max_steps: int) -> dict:
        """The trainer's online tuner (`lgs.online.OnlineTuning`, decided on rank 0 and
        broadcast) on real step times, the slowest rank's. Starts from the engine's thresholds;
        `path` lists (trials so far, incumbent) after every decision (rank 0)."""
        from megatron_lgs.lgs.online import OnlineTuning

        tuning = OnlineTuning(cfg.lgs, ddp.lgs, log=lambda _: None)
        start = list(ddp.lgs.thresholds_mb())
        steps = 0
        while steps < max_steps:
            tuning.before_step()
            if tuning.done:
                break
            t, loss = self.step(ddp)
            tuning.after_step(steps, self.slowest(t.step), loss)
            steps += 1
        tuner = tuning.tuner
        path = [] if tuner is None else [(0, start)] + [
            (self._trials_at(tuner, i), d["thresholds_after"])
            for i, d in enumerate(tuner.decisions)]
        return {"start": start, "thresholds": list(ddp.lgs.thresholds_mb()), "steps": steps,
                "trials": None if tuner is None else tuner.trials, "path": path,
                "decisions": [] if tuner is None else tuner.decisions, "done": tuning.done}

    @staticmethod
    def _trials_at(tuner, i: int) -> int:
        """Trials spent when decision i was taken (each comparison is a fixed number)."""
        return (i + 1) * tuner.config.trials_per_candidate

    def slowest(self, seconds: float) -> float:
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        self.torch.distributed.all_reduce(t, op=self.torch.distributed.ReduceOp.MAX)
        return float(t)

    def write(self, out: str, record: dict) -> None:
        Path(out, f"rank{self.rank}.json").write_text(json.dumps(record))

    def finish(self) -> None:
        from megatron_lgs import initialize

        initialize.destroy()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def model_flags(a) -> list[str]:
    """Trainer flags of the benchmarks' GPT (distributed optimizer: megatron's two-level form
    needs it, and every scheme runs with it so they move the same bytes). Every reduce-scatter
    is megatron-core's all-to-all + FP32 sum unless --ring-reduce-scatter: gloo's own
    reduce-scatter moves as many bytes as an all-reduce and needs more CPU (README)."""
    mb = a.micro_batches if isinstance(a.micro_batches, int) else a.micro_batches[0]
    rs = [] if a.ring_reduce_scatter else ["--reduce-scatter-with-fp32-accumulation"]
    return [*rs, "--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
            "--num-attention-heads", str(a.heads), "--seq-length", str(a.seq_length),
            "--micro-batch-size", str(a.micro_batch_size),
            "--global-batch-size", str(a.micro_batch_size * a.world * mb),
            "--vocab-size", str(a.vocab_size), "--no-save", "--use-distributed-optimizer"]


def add_model_args(p, *, hidden: int, layers: int, seq: int, vocab: int) -> None:
    p.add_argument("--num-layers", type=int, default=layers)
    p.add_argument("--hidden-size", type=int, default=hidden)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-length", type=int, default=seq)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--vocab-size", type=int, default=vocab)
    p.add_argument("--ring-reduce-scatter", action="store_true",
                   help="gloo's own reduce-scatter instead of megatron-core's all-to-all one "
                        "(--reduce-scatter-with-fp32-accumulation) for every scheme")
    p.add_argument("--no-comm-priority", dest="comm_priority", action="store_false",
                   help="leave communication threads at normal priority (by default they get "
                        "real-time priority over the compute thread, as on a GPU node)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--work-dir", type=Path, help="keep node logs and rank files here")
    p.add_argument("--worker", action="store_true", help=argparse_suppress())
    p.add_argument("--out", help=argparse_suppress())


def parse_bench_args(p):
    """The parsed flags, with the world size the emulated cluster will have."""
    a = p.parse_args()
    a.world = a.nodes * a.gpus_per_node
    return a


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS
