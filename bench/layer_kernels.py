"""One transformer layer's kernels, timed on this device against the whole-step model.

The published H100 runs are all slower than the model predicts (bench/published_runs.py), with
GEMMs 58-89% of each predicted step. This check says which kernels carry the gap: for a row of
that table it builds the layer's kernels at the row's per-GPU shapes (the GEMMs the model
times, forward, data and weight gradient, of QKV, projection, FC1 and FC2, in BF16 or in FP8
as Transformer Engine runs them through cuBLASLt; causal fused attention forward and backward
under cuDNN and FlashAttention-2, and CP's ring blocks; a LayerNorm and the MLP activation as
memory-bound passes), runs each for `--seconds` after the board has reached its power-limited
clock (`--ceiling-seconds` of 8192^3 GEMMs first: the state the model's sustained ceiling
describes), and prints predicted against measured time. torch's kernels, no Transformer
Engine. Runs anywhere; the comparison means something on the GPU its profile describes:

    python bench/layer_kernels.py [--rows ID ... | hopper] [--profile h200] [--seconds 1.0]
                                  [--ceiling-seconds 16] [--json OUT]
    python bench/layer_kernels.py --summarize bench/measured/h200-2026-12-04/layer_kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_runs import predicted, published_rows  # noqa: E402

from megatron_lgs.lgs.gpus import GPUS, get_gpu  # noqa: E402
from megatron_lgs.lgs.kernels import flash_attention_time, gemm_time, memory_time  # noqa: E402
from megatron_lgs.lgs.layercost import attention_blocks  # noqa: E402
from megatron_lgs.lgs.plan_run import HOPPER  # noqa: E402
from megatron_lgs.lgs.runspec import Run  # noqa: E402
from megatron_lgs.value_checks import output_file  # noqa: E402

DEFAULT_ROWS = ("megatron-h100-1.7B", "megatron-h100-177B", "megatron-moe-mixtral-8x7b")
# torch.cuda.get_device_name() substrings -> the profile the kernels are compared with.
DEVICE_PROFILES = (("H200", "h200"), ("H100", "h100-sxm"), ("H800", "h800"),
                   ("A100", "a100-80gb"), ("V100", "v100-32gb"))


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # gemm, attention_fwd, attention_bwd, memory
    # gemm (m, n, k); attention (batch, heads, q_len, kv_len, head_dim); memory (rows, cols)
    shape: tuple[int, ...]
    predicted_s: float  # all `count` calls
    precision: str = "bf16"  # a GEMM's: bf16 or fp8 (attention and memory kernels are BF16)
    causal: bool = True  # attention only
    count: int = 1  # identical calls per layer (CP's ring blocks)


def _attention(r: Run, gpu) -> list[Kernel]:
    """Forward and backward of each of `layercost.attention_blocks`, at the model's times."""
    heads, d, b = r.heads // r.tp, r.head_dim, r.micro_batch
    out = []
    for q_len, kv_len, causal, count, flops in attention_blocks(r):
        name = "attention" if causal else "attention ring"
        fwd, bwd = flash_attention_time(flops, gpu, q_len, kv_len)
        shape = (b, heads, int(q_len), int(kv_len), d)
        out.append(Kernel(f"{name} fwd", "attention_fwd", shape, fwd, causal=causal, count=count))
        out.append(Kernel(f"{name} bwd", "attention_bwd", shape, bwd, causal=causal, count=count))
    return out


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
            out.append(Kernel(f"{name} {part}", "gemm", shape, gemm_time(*shape, gpu, p), p))
    out += _attention(r, gpu)
    sp = t if r.sequence_parallel else 1
    norm, act = (tok // sp, h), (mlp_tok, f)
    out.append(Kernel("layernorm", "memory", norm, memory_time(2 * norm[0] * h * 2, gpu)))
    out.append(Kernel("activation", "memory", act, memory_time(2 * act[0] * f * 2, gpu)))
    return out


def _timed(fn, seconds: float, device: torch.device) -> float:
    """Mean seconds of fn() over a loop of about `seconds` after warm-up calls. On CUDA the
    loop replays a CUDA graph of fn() where fn can be captured (warmed up on a side stream, as
    torch's whole-network capture asks, so an autograd backward captures too), so that the
    host's dispatch and launch cost (the model's separate HOST_S_PER_KERNEL) does not hide
    short kernels' GPU time."""
    if device.type != "cuda":
        return _loop(fn, seconds, lambda: None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:  # timed eagerly instead, and said so in the log
        print(f"layer_kernels: no CUDA graph ({str(e).splitlines()[0]}); timing eagerly",
              flush=True)
        torch.cuda.synchronize()
        return _loop(fn, seconds, torch.cuda.synchronize)
    return _loop(graph.replay, seconds, torch.cuda.synchronize)


def _loop(fn, seconds: float, sync) -> float:
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


# FP8 GEMMs as Transformer Engine's hybrid recipe runs them through cuBLASLt: E4M3 activations
# and weights, E5M2 gradients; fast accumulation in the forward, split accumulation in both
# backward GEMMs (TE's _2X_ACC_FPROP False, _2X_ACC_DGRAD / _2X_ACC_WGRAD True).
FP8_OPERANDS = {"fwd": ("e4m3fn", "e4m3fn", True), "dgrad": ("e5m2", "e4m3fn", False),
                "wgrad": ("e4m3fn", "e5m2", False)}


def _fp8_gemm(kernel: Kernel, device: torch.device):
    m, n, k = kernel.shape
    a_type, b_type, fast = FP8_OPERANDS[kernel.name.split()[-1]]
    a = torch.randn(m, k, device=device).to(getattr(torch, f"float8_{a_type}"))
    # cuBLASLt's FP8 GEMM is TN only: B column-major.
    b = torch.randn(n, k, device=device).to(getattr(torch, f"float8_{b_type}")).t()
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)


def _random(device: torch.device):
    """A maker of random tensors here: BF16, or FP32 on a CPU, which has no fast BF16 matmul."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return lambda *shape: torch.randn(*shape, device=device, dtype=dtype)


def measure(kernel: Kernel, device: torch.device, seconds: float
            ) -> tuple[float, dict[str, float]]:
    """Seconds of the `count` calls of `kernel` here (BF16 or FP8 GEMMs as the kernel says,
    random data), and for attention each backend's (`attention_times`; the first that ran is
    the kernel's time)."""
    if kernel.kind.startswith("attention"):
        times = attention_times(kernel, device, seconds)
        return preferred(times), times
    return _plain_time(kernel, device, seconds), {}


def _plain_time(kernel: Kernel, device: torch.device, seconds: float) -> float:
    new = _random(device)
    if kernel.kind == "gemm":
        if kernel.precision == "fp8":
            return _timed(_fp8_gemm(kernel, device), seconds, device)
        m, n, k = kernel.shape
        a, b = new(m, k), new(k, n)
        return _timed(lambda: a @ b, seconds, device)
    x = new(*kernel.shape)  # a memory-bound pass
    if kernel.name == "layernorm":
        return _timed(lambda: torch.nn.functional.layer_norm(x, x.shape[-1:]), seconds, device)
    return _timed(lambda: torch.nn.functional.gelu(x), seconds, device)


def _attention_time(kernel: Kernel, device: torch.device, seconds: float) -> float:
    new = _random(device)
    b, heads, q_len, kv_len, d = kernel.shape
    q = new(b, heads, q_len, d).requires_grad_()
    k, v = (new(b, heads, kv_len, d).requires_grad_() for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd = _timed(lambda: sdpa(q, k, v, is_causal=kernel.causal), seconds, device)
    if kernel.kind == "attention_fwd":
        return kernel.count * fwd
    grad = new(b, heads, q_len, d)
    both = _timed(lambda: sdpa(q, k, v, is_causal=kernel.causal).backward(grad), seconds, device)
    return kernel.count * max(both - fwd, 0.0)


def attention_times(kernel: Kernel, device: torch.device, seconds: float) -> dict[str, float]:
    """Seconds of an attention kernel's `count` calls under each fused backend that runs it
    here: cuDNN's (what Transformer Engine's FusedAttention calls on Hopper) and
    FlashAttention-2's; on a CPU, torch's math path."""
    if device.type != "cuda":
        return {"math": _attention_time(kernel, device, seconds)}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out[name] = _attention_time(kernel, device, seconds)
        except RuntimeError as e:
            print(f"layer_kernels: {name} attention does not run {kernel.shape}: "
                  f"{str(e).splitlines()[0]}", flush=True)
    return out


def preferred(times: dict[str, float]) -> float:
    """The time of the first backend that ran, in `attention_times`' order."""
    if not times:
        raise RuntimeError("no attention backend ran")
    return next(iter(times.values()))


def sustained_gemm(device: torch.device, precision: str, seconds: float, dim: int = 8192
                   ) -> dict:
    """TFLOP/s of back-to-back dim^3 GEMMs on random data over the second half of `seconds`
    (the first half brings the board to its power-limited clock), and the SM clock then: the
    sustained ceiling the profiles take from [MSMF]."""
    name = "fwd" if precision == "fp8" else "gemm"
    kernel = Kernel(name, "gemm", (dim, dim, dim), 0.0, precision)
    if precision == "fp8":
        fn = _fp8_gemm(kernel, device)
    else:
        a, b = (torch.randn(dim, dim, device=device, dtype=torch.bfloat16) for _ in range(2))
        fn = lambda: a @ b  # noqa: E731
    _timed(fn, seconds / 2, device)
    per_call = _timed(fn, seconds / 2, device)
    out = {"precision": precision, "shape": [dim] * 3, "tflops": 2 * dim**3 / per_call / 1e12}
    try:  # nvidia-ml-py, where installed
        out["sm_clock_mhz"] = torch.cuda.clock_rate(device)
        out["power_w"] = torch.cuda.power_draw(device) / 1000
    except Exception as e:  # noqa: BLE001 - a figure we lack is reported, not fatal
        out["clock_error"] = f"{type(e).__name__}: {e}"
    return out


def check_row(row_id: str, profile: str, seconds: float, device: torch.device) -> dict:
    rows = {row["run"]["id"]: row for row in published_rows()}
    if row_id not in rows:
        raise SystemExit(f"layer_kernels: no published row {row_id!r}; known: {sorted(rows)}")
    _, est, _ = predicted(rows[row_id])
    r = replace(est.run, tp_comm_overlap=False)
    kernels = layer_kernels(r, profile)
    measured, backends = zip(*(measure(k, device, seconds) for k in kernels), strict=True)
    by_kind: dict[str, list[float]] = {}
    for k, m in zip(kernels, measured, strict=True):
        pair = by_kind.setdefault(k.kind.split("_")[0], [0.0, 0.0])
        pair[0] += k.predicted_s
        pair[1] += m
    return {"row": row_id, "profile": profile, "device": str(device), "precision": r.precision,
            "layout": f"TP{r.tp} PP{r.pp} CP{r.cp} EP{r.ep} mbs{r.micro_batch}",
            "kernels": [{"name": k.name, "shape": k.shape, "precision": k.precision,
                         "count": k.count, "predicted_s": k.predicted_s, "measured_s": m,
                         **({"backends": b} if b else {})}
                        for k, m, b in zip(kernels, measured, backends, strict=True)],
            "measured_over_predicted": {kind: m / p for kind, (p, m) in by_kind.items()},
            "layer_measured_over_predicted": sum(measured) / sum(k.predicted_s for k in kernels)}


def device_profile(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p for key, p in DEVICE_PROFILES if key in name), None)


def hopper_rows() -> list[str]:
    """Every published row on a Hopper GPU (the rows the model predicts too fast)."""
    return [row["run"]["id"] for row in published_rows() if row["run"]["gpu"] in HOPPER]


def _print_row(res: dict, device: torch.device) -> None:
    print(f"\n## {res['row']} ({res['precision']}, {res['layout']}) on {device}, "
          f"model profile {res['profile']}")
    print(f"{'kernel':<20} {'shape':<30} {'predicted ms':>12} {'measured ms':>11} {'ratio':>6}")
    for k in res["kernels"]:
        print(f"{k['name']:<20} {str(k['shape']):<30} {k['predicted_s'] * 1e3:>12.3f} "
              f"{k['measured_s'] * 1e3:>11.3f} {k['measured_s'] / k['predicted_s']:>6.2f}")
    kinds = ", ".join(f"{kind} {v:.2f}" for kind, v in res["measured_over_predicted"].items())
    print(f"measured / predicted: layer {res['layer_measured_over_predicted']:.2f} ({kinds})",
          flush=True)


def kernels_against_published(result: dict, row: dict) -> dict:
    """For one measured row: the model's step with its GEMM, attention and element-wise terms
    scaled by the kernels' measured / predicted ratios (recompute by the whole layer's), and the
    published step, both relative to the model's step. Terms sum to the step, so the scaling
    ignores any overlap that would hide the longer kernels. `row`: its published row."""
    pred, est, _ = predicted(row)
    b, step, ratio = est.breakdown, est.step_time_s, result["measured_over_predicted"]
    longer = (b["gemm"] * (ratio["gemm"] - 1) + b["attention"] * (ratio["attention"] - 1)
              + b["elementwise"] * (ratio["memory"] - 1)
              + b["recompute"] * (result["layer_measured_over_predicted"] - 1))
    slower = row["published"] / pred if row["metric"] == "iteration time s" \
        else pred / row["published"]
    return {"row": result["row"], "measured_kernels": 1 + longer / step, "published": slower}


def summarize(path: Path) -> list[dict]:
    """Print, for each row of a results file, the kernels' ratios and how much of the
    published step they explain."""
    results = [r for r in json.loads(path.read_text())["rows"] if "error" not in r]
    rows = {row["run"]["id"]: row for row in published_rows()}
    print(f"{'row':<28} {'gemm':>5} {'attn':>5} {'mem':>5}  {'step with measured kernels':>26}"
          f"  {'published step':>14}")
    out = []
    for res in results:
        ratio = res["measured_over_predicted"]
        gap = kernels_against_published(res, rows[res["row"]])
        print(f"{res['row']:<28} {ratio['gemm']:>5.2f} {ratio['attention']:>5.2f} "
              f"{ratio['memory']:>5.2f}  {gap['measured_kernels']:>26.3f}  "
              f"{gap['published']:>14.3f}")
        out.append(gap)
    kernels = statistics.median(g["measured_kernels"] for g in out)
    published = statistics.median(g["published"] for g in out)
    print(f"{'median':<48} {kernels:>8.3f}  {published:>14.3f}\n(measured / predicted time "
          f"per kind; steps relative to the model's: the kernels explain "
          f"{(kernels - 1) / (published - 1):.0%} of the median gap)")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS),
                    help="published row ids, or 'hopper' for every H100/H800/H200 row")
    ap.add_argument("--profile", choices=sorted(GPUS), help="default: this GPU's profile")
    ap.add_argument("--seconds", type=float, default=1.0, help="per kernel (default 1)")
    ap.add_argument("--ceiling-seconds", type=float, default=0.0,
                    help="first time 8192^3 GEMMs for this long per precision (default: skip)")
    ap.add_argument("--json", type=output_file, help="results, rewritten after each row")
    ap.add_argument("--summarize", type=Path, metavar="JSON",
                    help="measure nothing: read a results file and print each row's kernel "
                         "ratios against the published step")
    a = ap.parse_args(argv)
    if a.summarize:
        return {"summary": summarize(a.summarize)}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    profile = a.profile or device_profile(device)
    if profile is None:
        ap.error(f"no profile for device {device}: pass --profile")
    row_ids = hopper_rows() if a.rows == ["hopper"] else a.rows
    out: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
                 else "cpu", "torch": torch.__version__, "ceilings": [], "rows": []}
    if a.ceiling_seconds > 0:
        fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        for precision in ("bf16", "fp8") if fp8 else ("bf16",):
            c = sustained_gemm(device, precision, a.ceiling_seconds)
            peak = get_gpu(profile).gemm_tflops(precision)
            print(f"sustained {precision} 8192^3: {c['tflops']:.1f} TFLOP/s "
                  f"({c['tflops'] / peak:.1%} of {peak:g}), {c}", flush=True)
            out["ceilings"].append(c)
    for row_id in row_ids:
        try:
            res = check_row(row_id, profile, a.seconds, device)
        except (RuntimeError, ValueError) as e:  # one row's failure must not lose the others
            print(f"\n## {row_id}: not measured: {type(e).__name__}: {e}", flush=True)
            res = {"row": row_id, "error": f"{type(e).__name__}: {e}"}
        else:
            _print_row(res, device)
        out["rows"].append(res)
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
