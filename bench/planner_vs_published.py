"""The layout planner against the layouts published runs were tuned to.

For each dense row of the validation table (`published_runs.py`) that ran megatron-core with
Transformer Engine (NeMo, Megatron-Bridge, Megatron-LM's examples, NVIDIA's DGX Cloud recipes,
MLPerf), the planner (`megatron_lgs.lgs.planner`) searches the same model on the same GPUs at
the same global batch, with the row's software knobs, and this prints the published layout,
the planner's best and the step the model predicts for each. Both steps are the model's: where
the layouts differ, the planner's is a prediction that someone with the GPUs can test, and
where they agree, the planner found what the team that tuned the run chose. The planner
searches layouts for this repository's trainer (megatron-core's DDP, distributed optimizer or
Megatron-FSDP), so on rows of older software it may propose what that software could not run.
MoE rows are left out: the planner plans the all-to-all dispatcher, most of them ran another.

    python bench/planner_vs_published.py      # ~1 minute on 2 cores, offline
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from published_runs import predicted, published_rows  # noqa: E402

from megatron_lgs.lgs.plan_run import describe  # noqa: E402
from megatron_lgs.lgs.planner import best_of, candidates  # noqa: E402
from megatron_lgs.lgs.runspec import Run  # noqa: E402

# Rows whose software is megatron-core with Transformer Engine, by their id's prefix.
MEGATRON_CORE_ROWS = ("bridge-", "mlm-", "nemo-", "dgxc-", "mlperf")
LAYOUT = ("tp", "pp", "vpp", "cp", "dp", "ep", "micro_batch", "recompute", "zero",
          "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
          "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


def unplanned(r: Run) -> Run:
    """`r`'s model and software with the layout left to the planner (`plan_models.resolve`'s
    placeholder: everything on data parallelism, one micro-batch)."""
    return replace(r, tp=1, pp=1, cp=1, vpp=1, dp=r.num_gpus, ep=1, etp=1, micro_batch=1,
                   recompute="none", recompute_num_layers=0, zero=0,
                   distributed_optimizer=False, sequence_parallel=False,
                   decoder_first_pipeline_num_layers=0, decoder_last_pipeline_num_layers=0,
                   account_for_embedding_in_pipeline_split=False,
                   account_for_loss_in_pipeline_split=False)


def same_layout(a: Run, b: Run) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in LAYOUT)


def compare(rows: list[dict]) -> list[tuple[str, Run, float, Run, float]]:
    """(id, published run, its predicted step, the planner's best, its predicted step)."""
    out = []
    for row in rows:
        published = predicted(row)[1]
        best = best_of(candidates(unplanned(published.run)), 1)[0]
        out.append((row["run"]["id"], published.run, published.step_time_s, best.run,
                    best.step_time_s))
    return out


def dense_megatron_core_rows() -> list[dict]:
    return [row for row in published_rows() if row["run"]["id"].startswith(MEGATRON_CORE_ROWS)
            and not row["run"].get("num_experts")]


def main() -> list[tuple[str, Run, float, Run, float]]:
    result = compare(dense_megatron_core_rows())
    print("# PREDICTION: the planner's best layout against the published one, both predicted by "
          "the whole-step model (step s; gain: published layout's step / planner's)")
    print(f"{'run':<30} {'published layout':<44} {'step':>7}  {'planner':<44} {'step':>7} "
          f"{'gain':>6}")
    for rid, pub, pub_s, best, best_s in result:
        mark = "  same" if same_layout(pub, best) else ""
        print(f"{rid:<30} {describe(pub):<44} {pub_s:>7.3f}  {describe(best):<44} {best_s:>7.3f} "
              f"{pub_s / best_s:>5.3f}x{mark}")
    gains = [pub_s / best_s for _, _, pub_s, _, best_s in result]
    same = sum(same_layout(pub, best) for _, pub, _, best, _ in result)
    print(f"\n{len(result)} rows: the planner's best is the published layout on {same}, within "
          f"1% of it on {sum(g < 1.01 for g in gains)}; predicted gain median "
          f"{statistics.median(gains):.3f}x, largest {max(gains):.3f}x; "
          f"{sum(g > 1.05 for g in gains)} rows over 1.05x: "
          + ", ".join(f"{rid} {pub_s / best_s:.2f}x" for rid, _, pub_s, _, best_s in result
                      if pub_s / best_s > 1.05))
    return result


if __name__ == "__main__":
    main()
