"""Whole-step model against training runs published with their layout and throughput.

Every row cites its source (the data, with the software of the time stated per source, is
`published_rows.py`, `megatron2020_rows.py`, `moe_rows.py`, `mlperf_rows.py`, `dgxc_rows.py` and
`bloom_rows.py`). The model's inputs are the published layout plus that software; where a source
leaves a knob out (micro-batch size, virtual stages, the DDP) the row says what was assumed.
Hardware constants are the profiles of `megatron_lgs/lgs/gpus.py` (data sheets and
microbenchmarks), never fitted to these rows.
Throughput is compared in each source's own FLOP convention (Narayanan et al. count the full
recompute pass; the Megatron-LM README counts Megatron-LM's model FLOPs), or as the iteration
time (Korthikanti et al., BigScience's BLOOM) or tokens per second (NeMo, Megatron-Bridge; the
step times of MLPerf and of NVIDIA's DGX Cloud recipes) where the source gives that. Under the
table, the same rows again in the issue's fields alone, as a caller of `predict` outside this
repository gives a run. Offline, pure Python:

    python bench/published_runs.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_lgs.lgs.flops import flops_with_full_recompute, model_flops_per_step  # noqa: E402
from megatron_lgs.lgs.runspec import ISSUE_FIELDS, Run, RunError, run_from_dict  # noqa: E402
from megatron_lgs.lgs.stepmodel import StepEstimate, predict_run  # noqa: E402
from megatron_lgs.lgs.timeline import MB, ddp_buckets  # noqa: E402
from megatron_lgs.value_checks import output_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bloom_rows import BLOOM_LAYOUT_RUNS, BLOOM_LAYOUTS, BLOOM_RUN, bloom_rows  # noqa: E402
from dgxc_rows import dgxc_rows  # noqa: E402
from megatron2020_rows import megatron2020_rows  # noqa: E402
from mlperf_rows import MLPERF_FITS, mlperf_llama_rows, mlperf_rows  # noqa: E402
from moe_rows import (  # noqa: E402
    A2A_OVERLAP,
    FINE_GRAINED_MOE,
    MODELZOO,
    MODELZOO_BASE,
    MODELZOO_RUNS,
    long_context_rows,
    megatron_moe_rows,
    megatron_recipe_rows,
    modelzoo_mixtral_rows,
)
from published_rows import (  # noqa: E402
    BRIDGE_LATER,
    BRIDGE_LATER_RUNS,
    MEGATRON_H100_ROW,
    STRONG_SCALING,
    TORCHTITAN,
    TORCHTITAN_RUN,
    TORCHTITAN_RUNS,
    korthikanti_rows,
    megatron_bridge_rows,
    megatron_gpt3_2021_rows,
    megatron_h100_rows,
    megatron_llama_rows,
    narayanan_rows,
    nemo_rows,
)

UNPUBLISHED_MICRO_BATCHES = (1, 2, 4, 8)


def published_rows() -> list[dict]:
    """The table's rows, source by source."""
    return (megatron2020_rows() + narayanan_rows() + megatron_gpt3_2021_rows() + korthikanti_rows()
            + megatron_h100_rows() + megatron_moe_rows() + modelzoo_mixtral_rows()
            + megatron_bridge_rows() + megatron_llama_rows() + nemo_rows() + megatron_recipe_rows()
            + long_context_rows()
            + mlperf_rows() + mlperf_llama_rows() + dgxc_rows() + bloom_rows())


def _vpp_choices(run: Run) -> list[int]:
    per_stage = run.num_layers // run.pp
    return [v for v in range(1, per_stage + 1) if per_stage % v == 0
            and (v == 1 or (run.pp > 1 and run.num_micro_batches % run.pp == 0))]


def _fit_then_fast(est: StepEstimate) -> tuple[bool, float]:
    return est.fits_memory, -est.step_time_s


def estimates_by_micro_batch(row: dict) -> dict[int, StepEstimate]:
    """Per micro-batch size the row may take (the published one, or every size in
    UNPUBLISHED_MICRO_BATCHES that divides the batch), its best estimate over the virtual
    stages where the row says "fastest", preferring layouts that fit memory."""
    unpublished = row.get("micro_batch") == "not published"
    sizes = UNPUBLISHED_MICRO_BATCHES if unpublished else (row["run"]["micro_batch"],)
    out: dict[int, StepEstimate] = {}
    for mbs in sizes:
        try:
            base = run_from_dict({**row["run"], "micro_batch": mbs})
        except RunError:
            continue
        vpps = _vpp_choices(base) if row.get("vpp") == "fastest" else [base.vpp]
        out[mbs] = max((predict_run(replace(base, vpp=v)) for v in vpps), key=_fit_then_fast)
    return out


def tokens_per_gpu(est: StepEstimate) -> float:
    r = est.run
    return r.global_batch * r.seq_length / est.step_time_s / r.num_gpus


def metric(row: dict, est: StepEstimate) -> float:
    """The estimate in the row's published metric."""
    r = est.run
    if row["metric"] == "iteration time s":
        return est.step_time_s
    if row["metric"] == "tokens/s/GPU":
        return tokens_per_gpu(est)
    if row["metric"].endswith("(with recompute)"):
        return flops_with_full_recompute(r) / est.step_time_s / r.num_gpus / 1e12
    if row["metric"].endswith("(causal attention)"):
        return model_flops_per_step(r, causal=True) / est.step_time_s / r.num_gpus / 1e12
    return est.tflops_per_gpu


def predicted(row: dict) -> tuple[float, StepEstimate, dict[int, StepEstimate]]:
    """The row's predicted metric, its estimate, and (where the row leaves knobs to the model)
    the best estimate at each micro-batch size, the chosen one among them."""
    if row.get("micro_batch") == "not published" or row.get("vpp") == "fastest":
        by_mbs = estimates_by_micro_batch(row)
        est = max(by_mbs.values(), key=_fit_then_fast)
    else:
        mb = row.get("bucket_mb")
        th = ddp_buckets(mb * MB) if mb else None
        est = predict_run(run_from_dict(row["run"]), th, flat_buckets=th is not None)
        by_mbs = {est.run.micro_batch: est}
    return metric(row, est), est, by_mbs


def dominant_terms(est: StepEstimate, n: int = 3) -> str:
    parts = sorted(est.breakdown.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v / est.step_time_s:.0%}" for k, v in parts)


def strong_scaling() -> None:
    print("\n## outside the table: Megatron-LM README strong scaling, 177B, global batch 1152 "
          "(published MFU; layout not published, TP8 PP6 taken from the weak-scaling row)")
    for gpus, mfu in STRONG_SCALING:
        run = {**MEGATRON_H100_ROW, "id": f"megatron-h100-177B-{gpus}", "num_gpus": gpus,
               "num_layers": 96, "hidden": 12288, "heads": 96, "tp": 8, "pp": 6,
               "global_batch": 1152}
        _, est, _ = predicted({"metric": "TFLOP/s/GPU", "vpp": "fastest",
                               "micro_batch": "not published", "run": run})
        r = est.run
        print(f"{gpus:>5} GPUs  TP8 PP6 DP{r.dp} V{r.vpp} mbs{r.micro_batch}  published MFU "
              f"{mfu:.0%}  predicted {est.mfu:.1%}  ({est.mfu / mfu - 1:+.1%}; "
              f"{dominant_terms(est)})")


def per_micro_batch_fit(out: list[dict], pattern: str, label: str) -> None:
    """One software release at one layout over many scales (the rows whose ids match the
    regular expression `pattern` from their start, their tokens/s turned back into step times):
    step time as a line in the micro-batches each pipeline runs per step, published and
    predicted. The slope is the time of one micro-batch in the pipeline's steady state, the
    intercept what every step pays once (bubble, exposed gradient and parameter traffic,
    optimizer)."""
    rows = [row for row in out if re.match(pattern, row["run"]["id"])]
    runs = [run_from_dict(row["run"]) for row in rows]
    if len({(run.tp, run.pp, run.cp, run.vpp, run.micro_batch) for run in runs}) != 1:
        raise ValueError("the per-micro-batch fit needs one layout")
    m = [run.num_micro_batches for run in runs]
    published = [run.global_batch * run.seq_length / run.num_gpus / row["published"]
                 for run, row in zip(runs, rows, strict=True)]
    pub = statistics.linear_regression(m, published)
    pred = statistics.linear_regression(m, [row["step_time_s"] for row in rows])
    run = runs[0]
    gpus = [row["run"]["num_gpus"] for row in rows]
    cp = f" CP{run.cp}" if run.cp > 1 else ""
    print(f"\n## per micro-batch and per step: {len(rows)} {label}, one layout (TP{run.tp} "
          f"PP{run.pp}{cp} V{run.vpp} micro-batch {run.micro_batch}, DP growing), "
          f"{min(m)}-{max(m)} micro-batches a step, {min(gpus)}-{max(gpus)} GPUs: "
          "step = slope x micro-batches + intercept")
    print(f"published  slope {pub.slope * 1e3:.1f} ms, intercept {pub.intercept * 1e3:.0f} ms")
    print(f"predicted  slope {pred.slope * 1e3:.1f} ms, intercept {pred.intercept * 1e3:.0f} ms"
          f"  (slope {pred.slope / pub.slope - 1:+.1%}, intercept "
          f"{(pred.intercept - pub.intercept) * 1e3:+.0f} ms)")


def layout_label(r: Run, with_micro_batch: bool = True) -> str:
    return (f"TP{r.tp} PP{r.pp}" + (f" CP{r.cp}" if r.cp > 1 else "") + f" DP{r.dp}"
            + (f" EP{r.ep}" if r.ep > 1 else "") + (f" V{r.vpp}" if r.vpp > 1 else "")
            + (f" mbs{r.micro_batch}" if with_micro_batch else ""))


def fine_grained_moe(table_ids: set[str], table_errors: list[float]) -> None:
    """The fine-grained MoE runs, and the table's statistics with those outside it counted in
    (against the newest release)."""
    print("\n## outside the table: fine-grained MoE on DGX-H100, Megatron-Bridge's 25.11 and 25.09 "
          "tables (tokens/s/GPU; terms the model lacks: bench/moe_rows.py's "
          "FINE_GRAINED_MOE)")
    counted_in = list(table_errors)
    for spec, published in FINE_GRAINED_MOE:
        est = predict_run(run_from_dict(spec))
        r = est.run
        tokens = tokens_per_gpu(est)
        mem = est.memory
        against = ", ".join(f"{release} {value:.0f} ({tokens / value - 1:+.0%})"
                            for release, value in published.items())
        print(f"{r.id:<26} {layout_label(r):<27} predicted {tokens:.0f}; published {against}; "
              f"{dominant_terms(est)}; memory {mem.peak_bytes / 1e9:.0f} GB of "
              f"{mem.limit_bytes / 1e9:.0f}{'' if est.fits_memory else ', does not fit'}")
        if r.id not in table_ids:
            counted_in.append(abs(tokens / next(iter(published.values())) - 1))
    print(summary("table rows with these counted in,", counted_in))


def later_releases() -> None:
    """The table's Megatron-Bridge 25.11 H100 rows at the same layouts on later releases, which
    ran them at larger global batches: the model's figure at each batch against each release."""
    print(f"\n## outside the table: the same layouts on later releases, {BRIDGE_LATER} "
          "(tokens/s/GPU; the model with the 25.11 recipes' knobs at each global batch)")
    for spec, first, batch, published in BRIDGE_LATER_RUNS:
        before = tokens_per_gpu(predict_run(run_from_dict(spec)))
        after = tokens_per_gpu(predict_run(run_from_dict({**spec, "global_batch": batch})))
        releases = ", ".join(f"{release} {value:.0f} ({after / value - 1:+.1%})"
                             for release, value in published.items())
        print(f"{spec['id']:<26} global batch {spec['global_batch']} -> {batch}: predicted "
              f"{before:.0f} -> {after:.0f} ({after / before - 1:+.1%}); published 25.11 "
              f"{first:.0f} ({before / first - 1:+.1%}), {releases}")


def other_trainer() -> None:
    """torchtitan's Llama 3.1 8B on H200, its op-level activation checkpointing bracketed by
    no recompute and full recompute (`published_rows.TORCHTITAN_RUN`)."""
    print(f"\n## outside the table: another trainer on Hopper, {TORCHTITAN} (tokens/s/GPU; "
          "its recompute is none of Megatron's: predicted without and with full recompute)")
    for gpus, published in TORCHTITAN_RUNS:
        cells = []
        for recompute in ("none", "full"):
            est = predict_run(run_from_dict({
                **TORCHTITAN_RUN, "id": f"torchtitan-llama31-8b-{gpus}", "num_gpus": gpus,
                "global_batch": TORCHTITAN_RUN["micro_batch"] * gpus, "recompute": recompute}))
            tokens = tokens_per_gpu(est)
            cells.append(f"{recompute} {tokens:.0f} ({tokens / published - 1:+.0%})")
        r = est.run
        print(f"{r.id:<26} {layout_label(r):<27} published {published:.0f}; predicted "
              f"{', '.join(cells)}; with full recompute {dominant_terms(est)}")


def layout_ranking(source: str, base: dict, runs: list[tuple[str, str, float, dict]]) -> None:
    """One model on one GPU type at several published layouts: the step times predicted, and
    how many pairs of layouts the model orders as the source measured them."""
    print(f"\n## outside the table: ranking layouts, {source} (step time s; error: "
          "published / predicted - 1, positive where the model is too fast)")
    steps = []
    for label, code, published, fields in runs:
        run = run_from_dict({**base, "id": label, **fields})
        est = predict_run(run)
        steps.append((label, fields, published, est.step_time_s))
        fit = "" if est.fits_memory else ", does not fit"
        print(f"{label:<36} {code:<15} published {published:>5.1f}  predicted "
              f"{est.step_time_s:>5.1f}  error {published / est.step_time_s - 1:+7.1%}{fit}  "
              f"{layout_label(run)}; {dominant_terms(est)}")
    ranked = [(published, predicted) for _, _, published, predicted in steps]
    pairs = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:] if a[0] != b[0]]
    same = sum((a[0] < b[0]) == (a[1] < b[1]) for a, b in pairs)
    print(f"pairs of layouts ordered as published: {same} of {len(pairs)} (ties left out)")
    # A pair that differs only by the EP all-to-all overlap measures that one term's gain.
    for off, fields_off, published_off, predicted_off in steps:
        for on, fields_on, published_on, predicted_on in steps:
            if fields_on != fields_off and fields_on == {**fields_off, **A2A_OVERLAP}:
                print(f"the EP all-to-all overlap alone ({off} -> {on}): published "
                      f"{published_off / published_on:.2f}x faster, predicted "
                      f"{predicted_off / predicted_on:.2f}x")


def micro_batch_sensitivity(out: list[dict]) -> None:
    """Where a source leaves the micro-batch size out, the error at each size (virtual stages
    still the fastest): how much of a row's error is the choice."""
    assumed = [row for row in out if row.get("micro_batch") == "not published"]
    if not assumed:
        return
    print("\n## micro-batch size not published (the rows above take the fastest that fits): "
          "error at each size")
    for row in assumed:
        cells = [f"mbs {mbs}{'*' if mbs == row['micro_batch_used'] else ''} {err:+.1%}"
                 + ("" if fits else " (does not fit)")
                 for mbs, (err, fits) in row["error_by_micro_batch"].items()]
        print(f"{row['run']['id']:<26} " + ", ".join(cells))


def data_parallel_cost(out: list[dict]) -> None:
    """The 2020 README's rows ran each replica alone and at 128-way data parallelism: what
    joining 128 replicas over HDR added to the step, published and predicted (the gradient
    all-reduce, exposed or beside the backward, and the slowest of 128 replicas)."""
    rows = {row["run"]["id"]: row for row in out}
    print("\n## data parallelism's cost a step: the 2020 README's replicas alone (one DGX-A100) "
          "and 128 of them over HDR (ms)")
    for alone_id in [i for i in rows if i.startswith("megatron20-a100-") and "-dp" not in i]:
        alone, joined = rows[alone_id], rows[alone_id.replace("-a100-", "-a100-dp128-")]
        published = (joined["published"] - alone["published"]) * 1e3
        model = (joined["step_time_s"] - alone["step_time_s"]) * 1e3
        ddp = "PyTorch DDP" if joined["run"]["overlap_grad_reduce"] else "local DDP"
        print(f"{joined['run']['id']:<26} {layout_label(run_from_dict(joined['run']), False):<23}"
              f" published +{published:.0f}  predicted +{model:.0f}  ({ddp})")


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 1e4 else f"{v:.4g}"


def summary(label: str, errors: list[float]) -> str:
    return (f"{label} {len(errors)}: median |error| {statistics.median(errors):.1%}, worst "
            f"{max(errors):.1%}, {sum(e <= 0.10 for e in errors)} within 10%, "
            f"{sum(e <= 0.20 for e in errors)} within 20%")


def precision_pairs(out: list[dict]) -> None:
    """The rows published in both precisions with everything else the same (the DGX Cloud
    recipes): how much faster FP8 ran than BF16, against how much faster the model says."""
    rows = {row["run"]["id"]: row for row in out}
    pairs = [(rows[i], rows[i.replace("-bf16-", "-fp8-")]) for i in rows
             if i.startswith("dgxc-") and "-bf16-" in i]
    print("\n## FP8 against BF16, the same recipe and GPUs (the DGX Cloud rows): step time BF16 "
          "/ FP8, published and predicted")
    ratios = []
    for bf16, fp8 in pairs:
        pub = bf16["step_time_published_s"] / fp8["step_time_published_s"]
        pred = bf16["step_time_s"] / fp8["step_time_s"]
        ratios.append(pred / pub - 1)
        print(f"{fp8['run']['id']:<26} published {pub:.2f}x  predicted {pred:.2f}x  "
              f"({pred / pub - 1:+.1%})")
    print(f"the model's FP8 gain over BF16 is larger than published by a median "
          f"{statistics.median(ratios):+.1%} ({min(ratios):+.1%} to {max(ratios):+.1%})")
    print("step time from the first GPU count to the last, the same model (the 405B left out: "
          "its first count runs a 7-layer proxy)")
    for precision in ("bf16", "fp8"):
        ends: dict[str, list[dict]] = {}
        for row in out:
            run = row["run"]
            if run["id"].startswith("dgxc-") and row["precision"] == precision:
                ends.setdefault(run["id"].rsplit("-", 2)[0], []).append(row)
        growth = [(name, rows[-1]["step_time_published_s"] / rows[0]["step_time_published_s"] - 1,
                   rows[-1]["step_time_s"] / rows[0]["step_time_s"] - 1)
                  for name, rows in ends.items()
                  if rows[0]["run"]["num_layers"] == rows[-1]["run"]["num_layers"]]
        print(f"  {precision}: published " + ", ".join(f"{g:+.1%}" for _, g, _ in growth)
              + "; predicted " + ", ".join(f"{m:+.1%}" for _, _, m in growth)
              + f"  ({', '.join(name.removeprefix('dgxc-') for name, _, _ in growth)})")


def issue_fields_only(out: list[dict]) -> None:
    """The table as a caller of `predict` who knows only the issue's fields gets it: each row's
    run cut to `runspec.ISSUE_FIELDS`, at the micro-batch size and virtual stages the row used;
    what the model's own fields said takes their defaults or is read from the run
    (`run_defaults`)."""
    errors, refused, far = [], [], []
    for row in out:
        run = {k: v for k, v in row["run"].items() if k in ISSUE_FIELDS}
        run.update(micro_batch=row["micro_batch_used"], vpp=row["vpp_used"])
        if run.get("num_experts"):  # every layer is MoE: its one MLP width is the experts'
            run["ffn_hidden"] = row["run"].get("moe_ffn_hidden") or run.get("ffn_hidden")
        cut = {"metric": row["metric"], "run": run}
        try:
            value = predicted(cut)[0]
        except RunError as e:
            refused.append(f"{run['id']} ({e})")
            continue
        err = value / row["published"] - 1
        errors.append(abs(err))
        if abs(err) > 0.20:
            far.append(f"{run['id']} {err:+.1%} (with the row's own fields "
                       f"{row['relative_error']:+.1%})")
    print("\n## the same rows given only the issue's fields (runspec.ISSUE_FIELDS; the rest at "
          "their defaults or read from the run, runspec.read_run)")
    print(summary("rows", errors) + f"; {len(refused)} refused")
    for line in far + [f"refused: {x}" for x in refused]:
        print(f"  {line}")


def main(argv: list[str] | None = None) -> list[float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=output_file, help="also write the rows and predictions here")
    a = ap.parse_args(argv)
    print("# PREDICTION of the whole-step model (megatron_lgs/lgs/stepmodel.py) against "
          "published throughput")
    head = (f"{'run':<26} {'layout':<23} {'published':>9} {'predicted':>9} {'error':>7} "
            f"{'step s':>7} {'mem GB':>7}  largest terms")
    errors, out, source = [], [], None
    for row in published_rows():
        if row["source"] != source:
            source = row["source"]
            sign = " (negative error: predicted faster)" if row["metric"].endswith(" s") else ""
            print(f"\n## {source}\n## metric: {row['metric']}{sign}\n{head}")
        value, est, by_mbs = predicted(row)
        r = est.run
        err = value / row["published"] - 1
        errors.append(abs(err))
        lay = layout_label(r, with_micro_batch=row.get("micro_batch") == "not published")
        fit = "" if est.fits_memory else "!"
        print(f"{r.id:<26} {lay:<23} {_num(row['published']):>9} {_num(value):>9} {err:>+7.1%} "
              f"{est.step_time_s:>7.2f} {est.memory.peak_bytes / 1e9:>6.1f}{fit or ' '}  "
              f"{dominant_terms(est)}")
        out.append({**row, "predicted": value, "relative_error": err, "precision": r.precision,
                    "vpp_used": r.vpp, "micro_batch_used": r.micro_batch,
                    "error_by_micro_batch": {
                        mbs: (metric(row, e) / row["published"] - 1, e.fits_memory)
                        for mbs, e in by_mbs.items()},
                    "breakdown_s": est.breakdown,
                    "step_time_s": est.step_time_s, "fits_memory": est.fits_memory})
    print(f"\n{summary('rows', errors)}  (targets: median <= 10%, worst <= 20%; '!' = "
          "predicted not to fit memory)")
    for gpu in sorted({row["run"]["gpu"] for row in out}):
        print(summary(f"  {gpu} rows", [abs(row["relative_error"]) for row in out
                                         if row["run"]["gpu"] == gpu]))
        precisions = sorted({row["precision"] for row in out if row["run"]["gpu"] == gpu})
        for precision in precisions if len(precisions) > 1 else ():
            print(summary(f"    {precision}", [abs(row["relative_error"]) for row in out if
                                              (row["run"]["gpu"], row["precision"])
                                              == (gpu, precision)]))
    issue_fields_only(out)
    precision_pairs(out)
    data_parallel_cost(out)
    micro_batch_sensitivity(out)
    for pattern, label in MLPERF_FITS.items():
        per_micro_batch_fit(out, pattern, label)
    strong_scaling()
    fine_grained_moe({row["run"]["id"] for row in out}, errors)
    later_releases()
    layout_ranking(MODELZOO, MODELZOO_BASE, MODELZOO_RUNS)
    layout_ranking(BLOOM_LAYOUTS, BLOOM_RUN, BLOOM_LAYOUT_RUNS)
    other_trainer()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return errors


if __name__ == "__main__":
    main()
