"""bench/step_profile.py: kernel names land in the right kind, and a real CPU run's kinds and
uncovered time add up to its wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_GPT, _base_env

sys.path.insert(0, str(REPO / "bench"))

from step_profile import kind_of  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "elementwise"),
    ("aten::addmm", "gemm"),
])
def test_kernel_kinds(name, kind) -> None:
    assert kind_of(name) == kind


def test_a_cpu_run_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/step_profile.py"), "--skip", "1", "--steps", "2",
         "--json", str(out), *TINY_GPT, "--eval-iters", "0", "--log-interval", "100"],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert len(res["walls_s"]) == 2 and res["wall_s"] > 0
    assert res["kinds_s"]["gemm"] > 0 and res["model"] is None  # no GPU profile on a CPU
    assert sum(res["kinds_s"].values()) + res["uncovered_s"] >= res["wall_s"] * (1 - 1e-9)
    top = res["top_kernels"]
    assert top and [k["s"] for k in top] == sorted((k["s"] for k in top), reverse=True)
    assert sum(k["s"] for k in top if k["kind"] == "gemm") <= res["kinds_s"]["gemm"] + 1e-12
    assert "uncovered" in proc.stdout


def test_the_model_beside_it_reads_the_trainers_config() -> None:
    """On a GPU the profile prints the whole-step model's prediction of the same run, built from
    the trainer's parsed config as the planner builds it from a launch config; an fp32 run has
    no such prediction (the model times BF16, FP16 and FP8)."""
    from types import SimpleNamespace

    from step_profile import modelled, parse_args

    no_te = SimpleNamespace(te_available=False)
    bf16 = SimpleNamespace(cfg=parse_args([*TINY_GPT, "--bf16"], world_size=1), platform=no_te)
    fp32 = SimpleNamespace(cfg=parse_args(TINY_GPT, world_size=1), platform=no_te)
    m = modelled(bf16, "h200")
    assert m["profile"] == "h200" and m["step_s"] == pytest.approx(sum(m["breakdown_s"].values()))
    assert m["breakdown_s"]["attention"] > 0 and modelled(fp32, "h200") is None


def test_a_bad_trainer_flag_names_the_bench(capsys: pytest.CaptureFixture) -> None:
    """Trainer flags given to the bench are checked before anything starts, and the one-line
    error names the command the user ran, not pretrain_gpt.py."""
    from step_profile import main

    with pytest.raises(SystemExit) as exc:
        main(["--steps", "1", "--num-layerz", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert err[0] == "step_profile.py: error: unrecognized arguments: --num-layerz 2"
