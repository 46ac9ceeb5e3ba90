"""On a GPU with Transformer Engine: BF16 and FP8 steps of the TE spec, FP8 really active (TE's
scaling state moves), and the MFU of a ~1.3B GPT (printed, not asserted: performance is
measured in benchmarks). Skipped without CUDA and TE. `launch/gpu_check.sh` runs this file."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from megatron_lgs.platform import get_platform
from tests.conftest import REPO, _base_env, run_pretrain

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not get_platform().te_available,
    reason="needs a CUDA GPU with Transformer Engine")

TE = ["--transformer-impl", "transformer_engine", "--bf16", "--log-interval", "1"]
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "16",
       "--fp8-amax-compute-algo", "max"]

FP8_PROBE = textwrap.dedent("""
    import sys
    import torch
    import megatron_lgs  # platform first
    from megatron_lgs import initialize
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.model import build_model
    from megatron_lgs.platform import get_platform

    cfg = parse_args(sys.argv[1:], world_size=1)
    platform = get_platform()
    initialize.init_distributed(cfg, platform)
    initialize.set_seeds(cfg.training.seed)
    model = build_model(cfg, platform, 512)
    metas = [m.fp8_meta for m in model.modules() if hasattr(m, "fp8_meta")]
    assert metas, "no Transformer Engine module with FP8 state"
    tokens = torch.randint(0, 512, (2, 65), device="cuda")
    position_ids = torch.arange(64, device="cuda").expand(2, 64)
    for _ in range(3):
        loss = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:]).float().mean()
        loss.backward()
    histories = [m["scaling_fwd"].amax_history for m in metas if "scaling_fwd" in m]
    moved = sum(int(h.abs().sum().item() > 0) for h in histories)
    print(f"fp8 modules {len(histories)}, amax history recorded in {moved}")
    assert moved == len(histories) > 0
""")


def test_bf16_and_fp8_steps_train(tiny, tmp_path):
    for name, extra in (("bf16", []), ("fp8", FP8)):
        run = run_pretrain([*tiny, *TE, *extra, "--train-iters", "10"],
                           save_dir=tmp_path / name)
        losses = run.losses()
        assert "transformer engine: yes" in run.stdout
        assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
        assert losses[-1] < losses[0], name


def test_fp8_is_really_active(tmp_path):
    script = tmp_path / "fp8_probe.py"
    script.write_text(FP8_PROBE)
    args = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
            "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--vocab-size", "512", *TE, *FP8]
    proc = subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=_base_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "amax history recorded in" in proc.stdout


def _mfu_run(tiny: list[str], extra: list[str]) -> tuple[float, float]:
    """~1.3B GPT (launch/configs/gpt-1b.sh's shape) for 12 steps; (MFU %, tokens/s) of the
    last log interval, which leaves out the first steps' start-up."""
    shape = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
             "--seq-length", "2048", "--max-position-embeddings", "2048",
             "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
             "--ffn-hidden-size", "5632", "--disable-bias-linear",
             "--untie-embeddings-and-output-weights", "--micro-batch-size", "4",
             "--global-batch-size", "16", "--use-distributed-optimizer"]
    # No --save: a checkpoint of this model would be ~17 GB.
    run = run_pretrain([*tiny, *shape, *TE, *extra, "--train-iters", "12", "--log-interval",
                        "6", "--eval-iters", "0"])
    mfu = [float(x) for x in re.findall(r"MFU: ([0-9.]+)%", run.stdout)]
    tokens = [float(x) for x in re.findall(r"tokens per second: ([0-9.]+)", run.stdout)]
    assert mfu and tokens, run.stdout[-3000:]
    return mfu[-1], tokens[-1]


def test_mfu_of_a_1b_model_in_bf16_and_fp8(tiny, figures):
    bf16_mfu, bf16_tokens = _mfu_run(tiny, [])
    fp8_mfu, fp8_tokens = _mfu_run(tiny, FP8)
    figures("TE BF16 MFU", bf16_mfu, "%")
    figures("TE BF16 tokens per second", bf16_tokens)
    figures("TE FP8 tokens per second", fp8_tokens)
    print(f"\n~1.3B GPT, one GPU: BF16 MFU {bf16_mfu:.1f}% ({bf16_tokens:.0f} tokens/s); "
          f"FP8 {fp8_tokens:.0f} tokens/s = {fp8_tokens / bf16_tokens:.2f}x BF16 "
          f"(MFU counted against the BF16 peak: {fp8_mfu:.1f}%)")
    assert 0 < bf16_mfu < 100 and fp8_tokens > 0
