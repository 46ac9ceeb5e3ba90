"""How much gradient communication each sync scheme leaves exposed, on 4 gloo processes.

Four ranks on this machine as 2 nodes x 2 GPUs, one GPT big enough for gradient sync to matter,
three schemes built on the same model in the same processes and measured in interleaved rounds:

  (a) no overlap   megatron-core DDP, one reduction after the backward
  (b) megatron     megatron-core DDP with overlap_grad_reduce and its default bucket size
  (c) LGS          layer-wise buckets, intra-node reduce-scatter -> inter all-reduce -> gather

Step = zero grads -> forward/backward -> finish_grad_sync. Exposed communication = the time the
training thread spends in finish_grad_sync (waiting for, or doing, the reduction). Prints the
median of each and the ratios; numbers are measurements of this machine (a shared CPU, where
communication competes with compute for cores), not predictions for GPUs.

    python bench/lgs_overlap.py [--rounds 5 --steps 4 --hidden-size 512 --num-layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 4
SCHEMES = ("no overlap", "megatron", "LGS")


def _flags(args: argparse.Namespace) -> list[str]:
    return ["--num-layers", str(args.num_layers), "--hidden-size", str(args.hidden_size),
            "--num-attention-heads", "8", "--seq-length", str(args.seq_length),
            "--micro-batch-size", "2", "--global-batch-size", "8", "--vocab-size", "4096",
            "--no-save", "--lgs", "--lgs-gpus-per-node", str(args.gpus_per_node),
            "--lgs-intra-threshold-mb", str(args.intra_mb),
            "--lgs-inter-threshold-mb", str(args.inter_mb)]


def _step(ddp, tokens: torch.Tensor, position_ids: torch.Tensor) -> tuple[float, float]:
    started = time.perf_counter()
    ddp.zero_grad_buffer()
    loss = ddp(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:]).float().mean()
    loss.backward()
    waited = time.perf_counter()
    ddp.finish_grad_sync()
    done = time.perf_counter()
    return done - started, done - waited


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    from megatron_lgs import initialize
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.model import build_model
    from megatron_lgs.optim import wrap_ddp
    from megatron_lgs.platform import get_platform

    platform = get_platform()
    cfg = parse_args(_flags(args), world_size=WORLD)
    initialize.init_distributed(cfg, platform)
    configs = {
        "no overlap": replace(cfg, lgs=replace(cfg.lgs, lgs=False)),
        "megatron": replace(cfg, lgs=replace(cfg.lgs, lgs=False),
                            optim=replace(cfg.optim, overlap_grad_reduce=True)),
        "LGS": cfg,
    }
    models = {}
    for name, c in configs.items():
        initialize.set_seeds(c.training.seed)
        [models[name]] = wrap_ddp(c, [build_model(c, platform, 4096)], log=lambda _: None)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 4096, (2, args.seq_length + 1), generator=g)
    position_ids = torch.arange(args.seq_length).expand(2, args.seq_length)
    for ddp in models.values():  # first steps: megatron's and LGS's bucket bookkeeping
        _step(ddp, tokens, position_ids)
        _step(ddp, tokens, position_ids)
    times: dict[str, list[list[float]]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, ddp in models.items():
            times[name] += [_step(ddp, tokens, position_ids) for _ in range(args.steps)]
    numel = sum(p.numel() for p in models["LGS"].module.parameters())
    buckets = sum(len(bs.plan.buckets) for bs in models["LGS"].lgs.buffers)
    megatron_buckets = len(models["megatron"].bucket_groups)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"times": times, "numel": numel, "buckets": buckets,
                   "megatron_buckets": megatron_buckets}, f)
    initialize.destroy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4, help="steps per scheme per round")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--intra-mb", type=float, default=4.0)
    p.add_argument("--inter-mb", type=float, default=2.0)
    p.add_argument("--gpus-per-node", type=int, default=2, help="simulated ranks per node")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(_worker, args=(port, args, out), nprocs=WORLD, join=True)
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]

    # A step is as slow as its slowest rank: take the max over ranks, then the median.
    median = {}
    for name in SCHEMES:
        per_step = zip(*(r["times"][name] for r in results), strict=True)
        worst = [(max(t[0] for t in s), max(t[1] for t in s)) for s in per_step]
        median[name] = (statistics.median(w[0] for w in worst),
                        statistics.median(w[1] for w in worst))
    r0 = results[0]
    print(f"# measured on this machine: {WORLD} gloo ranks as {WORLD // args.gpus_per_node} "
          f"nodes x {args.gpus_per_node}, "
          f"{r0['numel'] / 1e6:.1f} M parameters ({4 * r0['numel'] / 2**20:.0f} MB of fp32 "
          f"gradients); megatron: {r0['megatron_buckets']} bucket(s), LGS: {r0['buckets']} "
          f"buckets (intra {args.intra_mb:g} MB, inter {args.inter_mb:g} MB)")
    print(f"{'scheme':<12} {'step ms':>9} {'exposed ms':>11} {'exposed/(a)':>12} "
          f"{'exposed/(b)':>12} {'step/(a)':>9}")
    a, b = median["no overlap"], median["megatron"]
    for name in SCHEMES:
        step, exposed = median[name]
        print(f"{name:<12} {1000 * step:>9.1f} {1000 * exposed:>11.1f} {exposed / a[1]:>12.3f} "
              f"{exposed / b[1]:>12.3f} {step / a[0]:>9.3f}")
    lgs = median["LGS"]
    print(f"ratio LGS exposed / no-overlap exposed: {lgs[1] / a[1]:.3f} (target <= 0.5)")
    print(f"ratio LGS exposed / megatron exposed: {lgs[1] / b[1]:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
