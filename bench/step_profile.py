"""Where one process's training step spends its device time: kernels by kind, and the rest.

Builds our Trainer with pretrain_gpt.py's flags, runs `--skip` steps, then profiles `--steps`
steps with torch.profiler and prints per step the wall time, the kernels' time per kind (GEMM,
attention, element-wise, optimizer, copies, communication) and the wall time no kernel covered
(host overhead and gaps; kernels of several streams that overlap make it an underestimate).
Beside it, the whole-step model's breakdown of the same run on this GPU's profile where the
flags describe one. On a CPU it sums aten operators' own time instead of kernels.

    python bench/step_profile.py [--skip 3 --steps 3 --json OUT] [pretrain_gpt.py flags]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from layer_kernels import device_profile  # noqa: E402

import megatron_lgs  # noqa: E402,F401  (prepares megatron-core for this machine)
import pretrain_gpt  # noqa: E402
from megatron_lgs import data  # noqa: E402
from megatron_lgs.arguments import parse_args  # noqa: E402
from megatron_lgs.lgs.plan_models import trainer_run_fields  # noqa: E402
from megatron_lgs.lgs.runcheck import check_run  # noqa: E402
from megatron_lgs.lgs.runspec import Run  # noqa: E402
from megatron_lgs.lgs.stepmodel import predict_run  # noqa: E402
from megatron_lgs.model import rope_fusion  # noqa: E402
from megatron_lgs.training import Trainer  # noqa: E402
from megatron_lgs.value_checks import output_file  # noqa: E402

# First match wins: kernel names (cuBLAS / CUTLASS / cuDNN / FlashAttention / NCCL / apex and
# torch's multi-tensor optimizers) and, on a CPU, aten operator names.
KINDS = (
    ("communication", ("nccl", "c10d::", "gloo")),
    ("attention", ("flash", "fmha", "sdpa", "attn", "softmax", "scaled_dot_product")),
    ("optimizer", ("multi_tensor", "adam", "_foreach")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "sm90_", "cublas", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm")),
    ("copy", ("memcpy", "memset")),
)


# Kernels listed by name, longest first: which of a kind's kernels carry its time.
TOP_KERNELS = 15


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "elementwise")


def _self_time_us(event, cuda: bool) -> float:
    if cuda:
        return getattr(event, "self_device_time_total", None) or event.self_cuda_time_total
    return event.self_cpu_time_total


def profile_steps(trainer: Trainer, skip: int, steps: int) -> dict:
    """Wall seconds per step and device seconds per step by kind, over `steps` steps."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t = trainer.cfg.training
    sampler = data.MicroBatchSampler(0, trainer.batch_sizes, t.micro_batch_size,
                                     trainer.dp_rank, trainer.dp_size)
    batches = data.micro_batch_stream(trainer.datasets.train, sampler, 0)
    for i in range(1, skip + 1):
        trainer.train_step(batches, i)
    activity = torch.profiler.ProfilerActivity
    walls = []
    with torch.profiler.profile(activities=[activity.CUDA] if cuda else [activity.CPU]) as prof:
        for i in range(skip + 1, skip + steps + 1):
            sync()
            start = time.perf_counter()
            trainer.train_step(batches, i)
            sync()
            walls.append(time.perf_counter() - start)
    kinds: dict[str, float] = {}
    kernels = []
    for event in prof.key_averages():
        if cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if not cuda and not event.key.startswith(("aten::", "c10d::")):
            continue
        kind, seconds = kind_of(event.key), _self_time_us(event, cuda) / 1e6 / steps
        kinds[kind] = kinds.get(kind, 0.0) + seconds
        kernels.append({"name": event.key, "kind": kind, "s": seconds, "calls": event.count})
    wall = sum(walls) / steps
    top = sorted(kernels, key=lambda k: -k["s"])[:TOP_KERNELS]
    return {"wall_s": wall, "walls_s": walls, "kinds_s": kinds, "top_kernels": top,
            "uncovered_s": max(0.0, wall - sum(kinds.values()))}


def modelled(trainer: Trainer, profile: str | None) -> dict | None:
    """The whole-step model's prediction of this run (one process) on `profile`."""
    if profile is None:
        return None
    cfg = trainer.cfg
    if cfg.parallel.world_size != 1 or cfg.precision.name == "fp32":
        return None
    model, layout = trainer_run_fields(cfg, 1)
    # What this process runs, not what a TE cluster would: RoPE fused only where TE is.
    model["rope_fusion"] = rope_fusion(cfg, trainer.platform)
    te = trainer.platform.te_available and cfg.model.transformer_impl != "local"
    run = Run(id="this run", gpu=profile, **model, **layout, dp=1, flash_attention=te)
    check_run(run)
    est = predict_run(run)
    return {"profile": profile, "step_s": est.step_time_s, "breakdown_s": est.breakdown}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog=Path(__file__).name,
                                  description=__doc__.splitlines()[0])
    ap.add_argument("--skip", type=int, default=3, help="steps before profiling (default 3)")
    ap.add_argument("--steps", type=int, default=3, help="steps profiled (default 3)")
    ap.add_argument("--json", type=output_file)
    a, trainer_argv = ap.parse_known_args(argv)
    cfg = parse_args([*trainer_argv, "--no-save", "--train-iters", str(a.skip + a.steps)],
                     prog=ap.prog)
    trainer = Trainer(cfg, pretrain_gpt.model_provider, pretrain_gpt.forward_step,
                      pretrain_gpt.datasets_provider)
    out = profile_steps(trainer, a.skip, a.steps)
    cuda = torch.cuda.is_available()
    out["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    out["model"] = modelled(trainer, device_profile(torch.device("cuda")) if cuda else None)
    print(f"\nstep on {out['device']}: {out['wall_s'] * 1e3:.1f} ms wall "
          f"(steps {', '.join(f'{w * 1e3:.1f}' for w in out['walls_s'])})")
    for kind, s in sorted(out["kinds_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<14} {s * 1e3:9.1f} ms  {s / out['wall_s']:6.1%}")
    print(f"  {'uncovered':<14} {out['uncovered_s'] * 1e3:9.1f} ms  "
          f"{out['uncovered_s'] / out['wall_s']:6.1%}")
    print("longest kernels per step (ms, calls per step, kind):")
    for k in out["top_kernels"]:
        print(f"  {k['s'] * 1e3:9.2f} {k['calls'] / a.steps:7.0f}  {k['kind']:<13} "
              f"{k['name'][:110]}")
    if out["model"]:
        terms = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in out["model"]["breakdown_s"].items()
                          if v > 0)
        print(f"model ({out['model']['profile']}): {out['model']['step_s'] * 1e3:.1f} ms: {terms}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
