"""Checkpoints of generated layouts leave the trainer: each accepted layout (bench/layout_sweep.py's
draw: TP, SP, PP, virtual stages, CP, EP, expert TP, the dispatchers, ZeRO-1 or Megatron-FSDP,
LGS, recompute) of an exportable tiny model (GPT-2, Llama with GQA, Mixtral-style MoE) trains 4
steps with validation every 2 and saves; the checkpoint is exported to a transformers directory
(`megatron_lgs.convert.export.to_hf`, what `python -m megatron_lgs.convert to-hf` runs) and
transformers' logits on a fixed batch must be those of the one-process run's export, within
1e-4, as must the training and validation losses the trainer logged. The suite exports from one
process and from TP2 x PP2 only (tests/distributed/test_hf_convert.py). Exits 1 on any mismatch,
crash or failed export.

    python bench/export_sweep.py --runs 30 --seed 11        # ~8 s a run on 2 cores
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may download

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from bench.layout_sweep import (  # noqa: E402
    BASE,
    MODELS,
    draw,
    reference_flags,
    refused,
    refused_at_start,
)
from megatron_lgs.convert import export  # noqa: E402
from tests.conftest import Run, run_pretrain  # noqa: E402

# Validation at iterations 0, 2 and 4, over 2 batches.
EVAL = ["--eval-interval", "2", "--eval-iters", "2"]
# The layout sweep's kinds as transformers has them: its MoE models on Llama's recipe
# (Mixtral; with --qk-layernorm, Qwen3-MoE), its GPT without query/key norms (GPT-2 has none).
LLAMA = MODELS["llama"]
EXPORTABLE = {"gpt": MODELS["gpt"], "llama": LLAMA,
              "moe": [*LLAMA, "--num-experts", "4", "--moe-router-topk", "2"],
              "moe-seq-aux": [*LLAMA, "--num-experts", "4", "--moe-router-topk", "2",
                              "--moe-router-load-balancing-type", "seq_aux_loss"]}
TOLERANCE = 1e-4
_VALIDATION = re.compile(r"validation loss at iteration \d+ \| lm loss value: ([0-9.E+-]+)")


def losses(run: Run) -> list[float]:
    """Training then validation losses, as logged."""
    return [*run.logged_losses(), *map(float, _VALIDATION.findall(run.stdout))]


def exported_logits(save: Path, tokens: torch.Tensor) -> torch.Tensor:
    out = export.to_hf(save, save / "hf")
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        return model(tokens).logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="accepted layouts to train and export")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng, work = random.Random(args.seed), Path(tempfile.mkdtemp(prefix="export-sweep-"))
    try:
        return sweep(args.runs, rng, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep(runs: int, rng: random.Random, work: Path) -> int:
    cache = str(work / "data")
    tokens = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(0))
    references: dict[tuple[str, tuple[str, ...]], tuple[list[float], torch.Tensor]] = {}
    outcome: Counter[str] = Counter()
    trained = 0
    while trained < runs:
        kind, _, world, layout = draw(rng)
        if kind == "gpt" and "--qk-layernorm" in layout:
            continue
        model = [*BASE, *EVAL, *EXPORTABLE[kind], "--data-cache-dir", cache]
        if refused([*model, *layout], world):
            outcome["refused in one line"] += 1
            continue
        same = reference_flags(layout)
        if (kind, same) not in references:
            reference = work / f"reference-{len(references)}"
            one = run_pretrain([*model, *same], save_dir=reference)
            references[kind, same] = losses(one), exported_logits(reference, tokens)
        saved = work / "checkpoint"
        run = run_pretrain([*model, *layout], nproc=world, save_dir=saved, expect_success=False)
        name = f"{kind} world {world} {' '.join(layout)}"
        reason = refused_at_start(run)
        if reason:
            outcome["refused in one line at start"] += 1
            print(f"refused  at start  {name}\n  {reason}", flush=True)
            shutil.rmtree(saved, ignore_errors=True)
            continue
        trained += 1
        if run.returncode != 0:
            outcome["crashed"] += 1
            print(f"CRASH {name}\n{run.stderr[-1500:]}", flush=True)
            shutil.rmtree(saved, ignore_errors=True)
            continue
        want_losses, want_logits = references[kind, same]
        try:
            logits_gap = (exported_logits(saved, tokens) - want_logits).abs().max().item()
        except Exception as exc:  # an export that fails is what the sweep looks for
            outcome["export failed"] += 1
            print(f"EXPORT FAILED {name}\n  {type(exc).__name__}: {exc}", flush=True)
            continue
        finally:
            shutil.rmtree(saved, ignore_errors=True)
        loss_gap = max(abs(a - b) for a, b in zip(losses(run), want_losses, strict=True))
        verdict = "ok" if max(loss_gap, logits_gap) <= TOLERANCE else "MISMATCH"
        outcome[verdict] += 1
        print(f"{verdict:8} losses {loss_gap:.1e} logits {logits_gap:.1e}  {name}", flush=True)
    print(f"summary: {dict(outcome)}")
    return 0 if outcome["ok"] == trained else 1


if __name__ == "__main__":
    sys.exit(main())
