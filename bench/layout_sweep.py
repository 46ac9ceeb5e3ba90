"""Generated parallel layouts against one process: each accepted layout of a tiny model trains 4
steps on 2 or 4 CPU ranks and its losses must be those of one process (fp32, dropout 0, within
1e-4, the bar of tests/distributed/test_parallel_equivalence.py; with --bf16 both train in bf16,
within 1e-3, through megatron's Float16Optimizer and the bf16 gradient paths). A layout the
trainer refuses must be refused in one line. Prints each run and a summary; exits 1 on any
mismatch or crash.

The equivalence matrix tests chosen layouts; this draws combinations of TP, SP, PP, virtual
stages, CP, EP, expert TP, the MoE dispatcher, the distributed optimizer or Megatron-FSDP, LGS
and recompute that nobody chose. On 2026-12-07 it found LGS leaving megatron's overlapped
parameter gather unarmed, and with --resume checkpoints under --overlap-param-gather holding
stale weights and sharded optimizer states failing to resume unsharded (all fixed; README,
"Benchmarks"). Since every optimizer sharding saves in one format (2026-12-07, later), --resume
draws the optimizer's sharding anew too.

With --resume each run stops after 2 steps with a checkpoint and takes its last 2 in another
drawn layout of the same model, loaded from it (resharding on resume; the fourth step's loss
is the first that the loaded optimizer state moves). With --grow-batch as well the resume is at
global batch 16, and the one process's batch ramps from 8 to 16 where the resume takes over.

    python bench/layout_sweep.py --runs 100 --seed 1            # ~6 s a run on 2 cores
    python bench/layout_sweep.py --runs 60 --seed 3 --resume
    python bench/layout_sweep.py --runs 60 --seed 6 --bf16 [--resume]
    python bench/layout_sweep.py --runs 50 --seed 8 --resume --grow-batch
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_lgs.arguments import parse_args  # noqa: E402
from tests.conftest import TINY_GPT, Run, run_pretrain  # noqa: E402

# The LR schedule is fixed at 4 iterations, so a run stopped at 2 and resumed decays alike.
BASE = [*TINY_GPT, "--num-layers", "4", "--eval-iters", "0", "--log-interval", "1",
        "--train-iters", "4", "--lr-decay-iters", "4", "--global-batch-size", "8"]
MODELS = {
    "gpt": [],
    "llama": ["--swiglu", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
              "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear"],
    "moe": ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear"],
    "moe-seq-aux": ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
                    "--moe-router-load-balancing-type", "seq_aux_loss"],
}
TOLERANCE = 1e-4
# In bf16 a dense layout's 4 losses stayed within 1e-4 of one process's here (TP2, PP2, DP2,
# ZeRO-1, TP2+SP x ZeRO-1), an MoE layout's within 7.4e-4 (routing in bf16; `--seed 6`,
# 2026-12-07); the faults the fp32 sweep found moved them by 1.7e-3 to 8e-2.
BF16_TOLERANCE = 1e-3
# --grow-batch: the resumed run's batch, and the one-process run that steps to it where the
# resume does (sample 16: 2 steps of the base's 8).
GROWN_BATCH = ["--global-batch-size", "16"]
RAMP_TO_GROWN = [*GROWN_BATCH, "--rampup-batch-size", "8", "8", "16"]
# Flags a layout draw may add that change the model, not its layout (valueless flags only).
MODEL_FLAGS = ("--qk-layernorm", "--untie-embeddings-and-output-weights")


def draw(rng: random.Random, kind: str | None = None) -> tuple[str, list[str], int, list[str]]:
    """(model kind, its flags, world size, layout flags) of one generated run."""
    kind = kind or rng.choice(sorted(MODELS))
    world = rng.choice([2, 4])
    tp, pp, cp = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 1, 2])
    flags = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
             "--context-parallel-size", str(cp), "--micro-batch-size", rng.choice(["1", "2"])]
    if tp > 1 and (kind.startswith("moe") or rng.random() < 0.5):
        flags.append("--sequence-parallel")
    if pp > 1:
        flags += rng.choice([[], ["--num-layers-per-virtual-pipeline-stage", "1"],
                             ["--decoder-first-pipeline-num-layers", "1"],
                             ["--account-for-embedding-in-pipeline-split",
                              "--account-for-loss-in-pipeline-split"]])
    if kind.startswith("moe"):
        flags += ["--expert-model-parallel-size", rng.choice(["1", "2", "4"]),
                  "--moe-token-dispatcher-type", rng.choice(["allgather", "alltoall"])]
        if rng.random() < 0.5:
            flags += ["--expert-tensor-parallel-size", rng.choice(["1", "2"])]
    if rng.random() < 0.3:
        flags += rng.choice([["--qk-layernorm"], ["--untie-embeddings-and-output-weights"]])
    if tp == pp == cp == 1 and rng.random() < 0.4:  # Megatron-FSDP runs pure DP only
        flags += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                  "optim_grads_params"]
    elif rng.random() < 0.5:
        flags += ["--use-distributed-optimizer", "--overlap-grad-reduce"]
        flags += rng.choice([[], ["--overlap-param-gather"], ["--ddp-bucket-size", "4000"]])
    if rng.random() < 0.3:
        flags.append("--lgs")
    if rng.random() < 0.3:
        flags += rng.choice([["--recompute-granularity", "selective"],
                             ["--recompute-granularity", "full", "--recompute-method", "uniform",
                              "--recompute-num-layers", "1"]])
    return kind, MODELS[kind], world, flags


def refused(argv: list[str], world: int) -> bool:
    """Whether the trainer refuses the flags (in one line: `parse_args` exits with it)."""
    try:
        parse_args(argv, world_size=world)
    except SystemExit:
        return True
    return False


def reference_flags(layout: list[str]) -> tuple[str, ...]:
    """What the one-process reference keeps of a drawn layout: its model flags and, as MoE's
    load-balancing loss is per micro-batch, its micro-batch size."""
    return tuple(f for f in layout if f in MODEL_FLAGS) + \
        ("--micro-batch-size", layout[layout.index("--micro-batch-size") + 1])


def refused_at_start(run: Run) -> str | None:
    """The line a run the trainer refused at start ended with (platform limits, refused
    reshards); None for a run that trained or crashed."""
    if run.returncode != 0 and "Traceback" not in run.stderr and "error: " in run.stderr:
        return run.stderr.strip().splitlines()[-1]
    return None


def other_layout(rng: random.Random, kind: str, layout: list[str], cache: str,
                 base: list[str]) -> tuple[int, list[str]]:
    """Another accepted layout of the same model: `layout`'s model flags and micro-batch size
    (MoE's load-balancing loss is per micro-batch), the rest (the optimizer's sharding too)
    drawn anew."""
    micro = layout[layout.index("--micro-batch-size") + 1]
    while True:
        _, _, world, other = draw(rng, kind)
        other = [f for f in other if f not in MODEL_FLAGS] + \
            [f for f in layout if f in MODEL_FLAGS]
        other[other.index("--micro-batch-size") + 1] = micro
        if not refused([*base, *MODELS[kind], "--data-cache-dir", cache, *other], world):
            return world, other


def trial(argv: list[str], world: int, resume: tuple[int, list[str]] | None,
          saved: Path) -> tuple[str, Run]:
    """Train `argv` for 4 steps; or, with `resume` (world, layout), for 2 with a checkpoint in
    `saved`, and the last 2 in that layout, loaded from it. (the resumed layout's name, the
    last run)."""
    if resume is None:
        return "", run_pretrain(argv, nproc=world, expect_success=False)
    first = run_pretrain([*argv, "--train-iters", "2"], nproc=world, save_dir=saved,
                         expect_success=False)
    other_world, other = resume
    name = f" -> world {other_world} {' '.join(other)}"
    if first.returncode != 0:
        return name, first
    cut = argv.index("--data-cache-dir") + 2  # the model's flags and the cache, then the layout
    then = run_pretrain([*argv[:cut], *other, "--load", str(saved)], nproc=other_world,
                        save_dir=saved / "resumed", expect_success=False)
    then.stdout = first.stdout + then.stdout  # all 4 steps' losses
    return name, then


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60, help="accepted layouts to train")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true",
                    help="stop each run after 2 steps and resume it in another drawn layout")
    ap.add_argument("--bf16", action="store_true",
                    help=f"train in bf16 (references too), within {BF16_TOLERANCE}")
    ap.add_argument("--grow-batch", action="store_true",
                    help="with --resume: resume at global batch 16 (from 8)")
    args = ap.parse_args()
    if args.grow_batch and not args.resume:
        ap.error("--grow-batch resumes at another batch size: add --resume")
    rng, work = random.Random(args.seed), Path(tempfile.mkdtemp(prefix="layout-sweep-"))
    base, tolerance = ([*BASE, "--bf16"], BF16_TOLERANCE) if args.bf16 else (BASE, TOLERANCE)
    try:
        return sweep(args.runs, args.resume, rng, work, base, tolerance, args.grow_batch)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep(runs: int, resume_each: bool, rng: random.Random, work: Path, base: list[str],
          tolerance: float, grow_batch: bool = False) -> int:
    cache = str(work / "data")
    references: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    outcome: Counter[str] = Counter()
    trained = 0
    while trained < runs:
        kind, model, world, layout = draw(rng)
        argv = [*base, *model, "--data-cache-dir", cache, *layout]
        if refused(argv, world):
            outcome["refused in one line"] += 1
            continue
        resume = other_layout(rng, kind, layout, cache, base) if resume_each else None
        if resume is not None and grow_batch:
            resume = resume[0], [*resume[1], *GROWN_BATCH]
        same = reference_flags(layout) + (tuple(RAMP_TO_GROWN) if grow_batch else ())
        if (kind, same) not in references:
            references[kind, same] = run_pretrain(
                [*base, *model, "--data-cache-dir", cache, *same]).logged_losses()
        saved = work / "checkpoint"
        then, run = trial(argv, world, resume, saved)
        shutil.rmtree(saved, ignore_errors=True)
        name = f"{kind} world {world} {' '.join(layout)}{then}"
        reason = refused_at_start(run)
        if reason:
            outcome["refused in one line at start"] += 1
            print(f"refused  at start  {name}\n  {reason}", flush=True)
            continue
        trained += 1
        if run.returncode != 0:
            outcome["crashed"] += 1
            print(f"CRASH {name}\n{run.stderr[-1500:]}", flush=True)
            continue
        got, want = run.logged_losses(), references[kind, same]
        gap = max(abs(a - b) for a, b in zip(got, want, strict=True))
        verdict = "ok" if gap <= tolerance else "MISMATCH"
        outcome[verdict] += 1
        print(f"{verdict:8} {gap:.1e}  {name}", flush=True)
    print(f"summary: {dict(outcome)}")
    return 0 if outcome["crashed"] == outcome["MISMATCH"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
