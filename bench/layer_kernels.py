"""One transformer layer's kernels, timed on this device against the whole-step model.

The published H100 runs are all slower than the model predicts (bench/published_runs.py), with
GEMMs 59-90% of each predicted step. This check says which kernels carry the gap: for a row of
that table it builds the layer's kernels at the row's per-GPU shapes (the GEMMs the model
times, forward, data and weight gradient, of QKV, projection, FC1 and FC2; causal flash
attention forward and backward; a LayerNorm and the MLP activation as memory-bound passes),
runs each for `--seconds` (long enough for the board to reach its power-limited clock, the
state the model's sustained ceiling describes), and prints predicted against measured time.
BF16 rows only (torch's cuBLAS GEMMs and scaled_dot_product_attention; no Transformer
Engine). Runs anywhere; the comparison means something on the GPU its profile describes:

    python bench/layer_kernels.py [--rows ID ...] [--profile h200] [--seconds 1.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_runs import predicted, published_rows  # noqa: E402

from megatron_lgs.lgs.gpus import GPUS, get_gpu  # noqa: E402
from megatron_lgs.lgs.kernels import gemm_time, memory_time  # noqa: E402
from megatron_lgs.lgs.runspec import Run  # noqa: E402
from megatron_lgs.lgs.stepmodel import flash_attention  # noqa: E402

DEFAULT_ROWS = ("megatron-h100-1.7B", "megatron-h100-177B", "megatron-moe-mixtral-8x7b")
# torch.cuda.get_device_name() substrings -> the profile the kernels are compared with.
DEVICE_PROFILES = (("H200", "h200"), ("H100", "h100-sxm"), ("H800", "h800"),
                   ("A100", "a100-80gb"), ("V100", "v100-32gb"))


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # gemm, attention_fwd, attention_bwd, memory
    shape: tuple[int, ...]  # gemm (m, n, k); attention (b, heads, s, d); memory (rows, cols)
    predicted_s: float


def layer_kernels(r: Run, profile: str) -> list[Kernel]:
    """The kernels of one layer of `r` at its per-GPU shapes, each with the model's time on
    `profile`. GEMMs unsplit (the shapes without TP overlap's chunking); a dense MLP, or one
    expert's GEMMs at its balanced token count for an MoE row."""
    gpu = get_gpu(profile)
    t, h, p = r.tp, r.hidden, r.precision
    tok = r.micro_batch * r.seq_length // r.cp
    mats = 2 if r.swiglu else 1
    if r.num_experts:
        mlp_tok = tok * r.moe_topk * r.etp * r.ep // (t * r.num_experts)
        f = r.expert_ffn // r.etp
    else:
        mlp_tok, f = tok, r.ffn_hidden // t
    linears = (("qkv", tok, (r.q_dim + 2 * r.kv_dim) // t, h), ("proj", tok, h, r.q_dim // t),
               ("fc1", mlp_tok, f * mats, h), ("fc2", mlp_tok, h, f))
    out = []
    for name, m, n, k in linears:
        for part, shape in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (k, n, m))):
            out.append(Kernel(f"{name} {part}", "gemm", shape, gemm_time(*shape, gpu, p)))
    heads, d = r.heads // t, r.head_dim
    fwd, bwd = flash_attention(r, gpu)
    shape = (r.micro_batch, heads, r.seq_length, d)
    out.append(Kernel("attention fwd", "attention_fwd", shape, fwd))
    out.append(Kernel("attention bwd", "attention_bwd", shape, bwd))
    sp = t if r.sequence_parallel else 1
    norm, act = (tok // sp, h), (mlp_tok, f)
    out.append(Kernel("layernorm", "memory", norm, memory_time(2 * norm[0] * h * 2, gpu)))
    out.append(Kernel("activation", "memory", act, memory_time(2 * act[0] * f * 2, gpu)))
    return out


def _timed(fn, seconds: float, device: torch.device) -> float:
    """Mean seconds of fn() over a loop of about `seconds` after a warm-up call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    n = max(3, int(seconds / max(time.perf_counter() - start, 1e-6)))
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n


def measure(kernel: Kernel, device: torch.device, seconds: float) -> float:
    """Seconds one call of `kernel` takes here (BF16 on CUDA, FP32 on a CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    new = lambda *s: torch.randn(*s, device=device, dtype=dtype)  # noqa: E731
    if kernel.kind == "gemm":
        m, n, k = kernel.shape
        a, b = new(m, k), new(k, n)
        return _timed(lambda: a @ b, seconds, device)
    if kernel.kind == "memory":
        x = new(*kernel.shape)
        if kernel.name == "layernorm":
            return _timed(lambda: torch.nn.functional.layer_norm(x, x.shape[-1:]), seconds, device)
        return _timed(lambda: torch.nn.functional.gelu(x), seconds, device)
    q, k, v = (new(*kernel.shape).requires_grad_() for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd = _timed(lambda: sdpa(q, k, v, is_causal=True), seconds, device)
    if kernel.kind == "attention_fwd":
        return fwd
    grad = new(*kernel.shape)
    both = _timed(lambda: sdpa(q, k, v, is_causal=True).backward(grad), seconds, device)
    return max(both - fwd, 0.0)


def check_row(row_id: str, profile: str, seconds: float, device: torch.device) -> dict:
    rows = {row["run"]["id"]: row for row in published_rows()}
    if row_id not in rows:
        raise SystemExit(f"layer_kernels: no published row {row_id!r}; known: {sorted(rows)}")
    _, est, _ = predicted(rows[row_id])
    r = replace(est.run, tp_comm_overlap=False)
    if r.precision != "bf16":
        raise SystemExit(f"layer_kernels: row {row_id} is {r.precision}; BF16 rows only")
    kernels = layer_kernels(r, profile)
    measured = [measure(k, device, seconds) for k in kernels]
    by_kind: dict[str, list[float]] = {}
    for k, m in zip(kernels, measured, strict=True):
        pair = by_kind.setdefault(k.kind.split("_")[0], [0.0, 0.0])
        pair[0] += k.predicted_s
        pair[1] += m
    return {"row": row_id, "profile": profile, "device": str(device),
            "layout": f"TP{r.tp} PP{r.pp} mbs{r.micro_batch}",
            "kernels": [{"name": k.name, "shape": k.shape, "predicted_s": k.predicted_s,
                         "measured_s": m} for k, m in zip(kernels, measured, strict=True)],
            "measured_over_predicted": {kind: m / p for kind, (p, m) in by_kind.items()},
            "layer_measured_over_predicted": sum(measured) / sum(k.predicted_s for k in kernels)}


def device_profile(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p for key, p in DEVICE_PROFILES if key in name), None)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS))
    ap.add_argument("--profile", choices=sorted(GPUS), help="default: this GPU's profile")
    ap.add_argument("--seconds", type=float, default=1.0, help="per kernel (default 1)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    profile = a.profile or device_profile(device)
    if profile is None:
        ap.error(f"no profile for device {device}: pass --profile")
    results = []
    for row_id in a.rows:
        res = check_row(row_id, profile, a.seconds, device)
        print(f"\n## {row_id} ({res['layout']}) on {device}, model profile {profile}")
        print(f"{'kernel':<15} {'shape':<26} {'predicted ms':>12} {'measured ms':>11} {'ratio':>6}")
        for k in res["kernels"]:
            print(f"{k['name']:<15} {str(k['shape']):<26} {k['predicted_s'] * 1e3:>12.3f} "
                  f"{k['measured_s'] * 1e3:>11.3f} {k['measured_s'] / k['predicted_s']:>6.2f}")
        kinds = ", ".join(f"{kind} {v:.2f}" for kind, v in res["measured_over_predicted"].items())
        print(f"measured / predicted: layer {res['layer_measured_over_predicted']:.2f} ({kinds})")
        results.append(res)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
