"""The GPU check, as far as the CPU can check it: the wheel kit (size limit, the device command,
what the GPU machine's imports need), the scripts, the figures file, the MFU arithmetic of the
~1.3B shape, the local spec's GPU configuration, the device comparison run CPU-vs-CPU, and
tests/gpu skipping with its reasons."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest
import torch

from launch.gpu_kit import fetch_wheels
from megatron_lgs import platform
from megatron_lgs.arguments import parse_args
from megatron_lgs.metrics import throughput
from megatron_lgs.model import flops_per_token, transformer_config
from tests.conftest import REPO, TINY_GPT, _base_env
from tests.gpu import figures, runs

KIT = REPO / "launch" / "gpu_kit"
SIMULATED_GPU_MACHINE = {"PYTHONPATH": str(KIT / "gpu_machine_imports")}


def _check(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KIT / "fetch_wheels.py"), "--check", "--dest",
                           str(folder)], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.fixture
def kit_folder():
    """A kit folder inside the repository (only those can be carried), git-ignored."""
    folder = KIT / f"wheels-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


def test_kit_size_check_refuses_a_folder_over_the_limit(kit_folder, tmp_path):
    empty = _check(kit_folder)
    assert empty.returncode == 2 and "no wheels in" in empty.stderr
    (kit_folder / "megatron_core-0.16.1-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(
        b"w" * 2**20)
    ok = _check(kit_folder)
    assert ok.returncode == 0, ok.stderr
    assert "1.00 MiB of wheels" in ok.stdout
    assert fetch_wheels.device_command(kit_folder) in ok.stdout
    with open(kit_folder / "big-1.0-py3-none-any.whl", "wb") as f:
        f.truncate(fetch_wheels.LIMIT_BYTES)  # sparse: the size counts, not the disk
    refused = _check(kit_folder)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "over the 64 MiB" in refused.stderr
    with pytest.raises(fetch_wheels.KitError):
        fetch_wheels.check_size(kit_folder, tree_bytes=0)
    outside = _check(tmp_path)  # cannot be carried
    assert outside.returncode == 2 and "outside the repository" in outside.stderr


def test_kit_lists_what_the_gpu_machine_lacks_and_nothing_it_has():
    kit = {fetch_wheels.dist_name(r) for r in fetch_wheels.KIT}
    assert "megatron-core" in kit and "webdataset" in kit and "pytest" in kit
    assert not kit & {fetch_wheels.dist_name(n) for n in fetch_wheels.GPU_MACHINE_HAS}
    assert all("==" in r for r in fetch_wheels.KIT)  # the repo's pins, nothing resolved there
    pins = dict(line.split("==") for line in (REPO / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for requirement in fetch_wheels.KIT:
        name, version = requirement.split("==")
        assert pins.get(name, version) == version, requirement


def test_device_command_fits_the_device_tool():
    command = fetch_wheels.device_command()
    assert len(command) < 2000 and "launch/gpu_kit/wheels" in command
    assert "bash launch/gpu_check.sh" in command
    ignored = subprocess.run(["git", "check-ignore", "-q", "launch/gpu_kit/wheels/x.whl"],
                             cwd=REPO)
    assert ignored.returncode == 0, "the wheel folder must be git-ignored (it is carried)"


def test_gpu_check_script_parses_installs_offline_and_runs_every_gpu_test(tmp_path):
    script = REPO / "launch" / "gpu_check.sh"
    for path in (script, REPO / "launch" / "torchrun.sh"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path
    text = script.read_text()
    assert "make install" not in text
    installs = re.findall(r"-m pip install((?:\\\n|[^\n])*)", text)  # with continuations
    assert installs and all("--no-index" in cmd and "--target" in cmd for cmd in installs)
    listed = set(re.findall(r"tests/gpu/(test_\w+\.py)", text))
    assert listed == {p.name for p in (REPO / "tests" / "gpu").glob("test_*.py")}
    # No kit: one line and exit 2, before anything runs.
    env = {**os.environ, "GPU_KIT": str(tmp_path / "none"), "PYTHON": sys.executable,
           "OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(script)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no wheels in" in proc.stdout
    assert (tmp_path / "out" / "gpu_check.log").read_text() == proc.stdout


def test_figures_file_keeps_every_figure_and_outcome(tmp_path):
    path = tmp_path / "out" / "gpu_figures.json"
    log = figures.FigureLog(path, {"device": "test"})
    log.record("t.py::a", "MFU", 0.41)
    log.record("t.py::a", "peak", 1024.0, "MiB")
    log.record("t.py::b", "diff", float("nan"))
    log.outcome("t.py::a", "passed", 1.234)
    log.outcome("t.py::c", "skipped", 0.0, "needs a CUDA GPU")
    doc = json.loads(path.read_text())
    assert doc["machine"] == {"device": "test"}
    assert doc["figures"]["t.py::a"] == {"MFU": {"value": 0.41},
                                         "peak": {"value": 1024.0, "unit": "MiB"}}
    assert doc["figures"]["t.py::b"]["diff"] == {"value": None}
    assert doc["tests"]["t.py::c"] == {"outcome": "skipped", "seconds": 0.0,
                                       "detail": "needs a CUDA GPU"}
    assert figures.main(["--finish", str(path), "--exit-code", "1", "--seconds", "9"]) == 0
    closed = json.loads(path.read_text())
    assert closed["exit_code"] == 1 and closed["figures"] == doc["figures"]
    assert figures.finish(tmp_path / "never.json", 124, 420.0)["tests"] == {}  # killed early


def test_mfu_arithmetic_of_the_1b_shape():
    cfg = parse_args(runs.GPT_1B_RUN, world_size=1)  # the GPU run's flags are accepted
    # Per layer and token, in multiply-adds: Q, K, V, output projections 4 h^2; SwiGLU's three
    # matrices 3 h f; attention scores and their product with V 2 s h. Plus the logits h V.
    # Training = 3 x forward, 2 FLOPs per multiply-add: 6 x.
    h, f, s, layers, vocab = 2048, 5632, 2048, 24, 512
    per_layer = 4 * 2048 * 2048 + 3 * 2048 * 5632 + 2 * 2048 * 2048
    assert per_layer == 59_768_832
    expected = 6 * (layers * per_layer + h * vocab)
    assert expected == 8_613_003_264
    assert flops_per_token(cfg, vocab) == expected
    assert (h, f, s) == (cfg.model.hidden_size, cfg.model.ffn_size, cfg.model.seq_length)
    # 40,000 tokens/s on one H200 (989 dense BF16 TFLOP/s): 344.52 TFLOP/s, MFU 34.8%.
    tflops, mfu = throughput(40_000, expected, 1, 989.0)
    assert tflops == pytest.approx(344.52013056)
    assert mfu == pytest.approx(344.52013056 / 989.0)
    assert throughput(40_000, expected, 2, None) == (pytest.approx(172.26006528), None)


def test_local_spec_configuration_for_a_gpu_builds_and_runs():
    """The GPU flavour of the local spec's TransformerConfig (fusions on), built here: the
    torch norm refuses the persistent layer norm, megatron-core's softmax fusion imports
    kernels no wheel carries, its bias-GeLU fusion refuses a model without biases."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.utils import attention_mask_func

    cuda = platform.Platform(torch.device("cuda"), "nccl", False, "not installed")
    for extra in ([], ["--disable-bias-linear"], ["--swiglu"]):
        config = transformer_config(parse_args([*TINY_GPT, "--bf16", *extra], world_size=1),
                                    cuda)
        assert config.bias_dropout_fusion and not config.persist_layer_norm
        WrappedTorchNorm(config, hidden_size=64)
        softmax = FusedScaleMaskSoftmax(
            input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.causal,
            scaled_masked_softmax_fusion=config.masked_softmax_fusion,
            mask_func=attention_mask_func,
            softmax_in_fp32=True, scale=None)
        scores = torch.randn(4, 4, 64, 64, dtype=torch.bfloat16)
        probs = softmax(scores, None)  # causal: megatron-core builds the mask
        assert torch.allclose(probs.float().sum(-1), torch.ones(4, 4, 64), atol=1e-2)


def test_cpu_patches_are_found_in_place_on_cpu():
    found = platform.installed_cpu_patches()
    assert "torch.cuda.current_device" in found and "torch.Tensor.cuda" in found
    assert "megatron.core.optimizer.grad_scaler.torch" in found


def test_device_comparison_cpu_vs_cpu_on_the_gpu_machines_imports(tiny, tmp_path):
    """The comparison the GPU check makes (CUDA vs CPU), made CPU vs CPU; the reference run
    sees only the GPU machine's packages plus the kit, as the GPU check's runs will."""
    mine, reference, diff = runs.compare_devices(tiny, tmp_path, "cpu",
                                                 reference_env=SIMULATED_GPU_MACHINE)
    assert len(mine) == 3 and diff == 0.0, (mine, reference)  # same device: bit for bit
    assert runs.max_difference(mine, [x + 2e-4 for x in mine]) > 1e-4


def test_gpu_tests_skip_cleanly_with_reasons(tmp_path):
    """Collected with only the GPU machine's packages plus the kit; every test skipped with
    its reason, and the figures file says so."""
    out = tmp_path / "gpu_figures.json"
    env = {**_base_env(), "GPU_FIGURES": str(out)}
    env["PYTHONPATH"] = os.pathsep.join([SIMULATED_GPU_MACHINE["PYTHONPATH"], str(REPO)])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/gpu"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" not in proc.stdout and " failed" not in proc.stdout
    tests = json.loads(out.read_text())["tests"]
    gpu_tests = [p for p in (REPO / "tests" / "gpu").glob("test_*.py")]
    assert {t.split("::")[0] for t in tests} == {f"tests/gpu/{p.name}" for p in gpu_tests}
    for name, entry in tests.items():
        assert entry["outcome"] == "skipped", name
        assert entry["detail"].startswith("needs a CUDA GPU"), entry


def test_gpu_tests_read_the_trainers_own_lines():
    """The GPU tests parse the console: the lines as the trainer formats them."""
    from megatron_lgs import memory, metrics
    from tests.conftest import Run

    state = {"parameters": 3 * 2**20, "gradients": 2**20, "optimizer_state": 5 * 2**20}
    device = {"allocated": 7 * 2**20, "max_allocated": 9 * 2**20, "reserved": 10 * 2**20,
              "max_reserved": 11 * 2**20}
    logs = [metrics.training_log_line(
        iteration=i, train_iters=12, consumed_samples=16 * i, ms_per_iteration=800.0, lr=1e-4,
        global_batch_size=16, loss=6.0, loss_scale=1.0, grad_norm=1.0, skipped=0,
        nan_iterations=0, tokens_per_second=tokens, tflops_per_gpu=tokens / 1000, mfu=0.3)
        for i, tokens in ((4, 1000.0), (8, 3000.0), (12, 5000.0))]
    stdout = "\n".join([memory.memory_log_line([state], " at start-up"), logs[0],
                        memory.memory_log_line([state]),
                        memory.device_memory_log_line([device], 4), *logs[1:]])
    run = Run(0, stdout, "", None)
    assert runs.steady_state(run) == {"tflops_per_gpu": 4.0, "tokens_per_second": 4000.0,
                                      "intervals": 2}
    report = runs.memory_report(run)
    assert report["startup"] == report["after first step"] == {
        "parameters": 3.0, "gradients": 1.0, "optimizer_state": 5.0}
    assert report["device"] == {"allocated": 7.0, "max_allocated": 9.0, "reserved": 10.0,
                                "max_reserved": 11.0}
    assert runs.logged_mfu(run) == [30.0, 30.0, 30.0]


def test_ranks_start_as_a_user_would_where_cuda_is_present(tiny, monkeypatch):
    """A fork of the suite's forkserver cannot use CUDA (the GPU machine refused it on
    2026-12-04): with CUDA present, run_pretrain's default launcher is a real process."""
    import tests.conftest as suite

    def no_fork(*args, **kwargs):
        raise AssertionError("forked ranks where CUDA is present")

    monkeypatch.setattr(suite, "run_ranks", no_fork)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    bad = suite.run_pretrain([*tiny, "--num-attention-heads", "3"], expect_success=False)
    assert bad.returncode == 2
    assert "--hidden-size (64) must be divisible" in bad.stderr


def test_rope_is_fused_only_on_a_gpu_with_transformer_engine():
    """Megatron-LM's default, fused RoPE, wherever TE's kernel exists; torch ops elsewhere and
    with --no-rope-fusion (megatron-core refuses the fusion without TE)."""
    from megatron_lgs.model import rope_fusion

    rope = [*TINY_GPT, "--position-embedding-type", "rope"]
    te_gpu = platform.Platform(torch.device("cuda"), "nccl", True, None)
    bare_gpu = platform.Platform(torch.device("cuda"), "nccl", False, "not installed")
    cpu = platform.get_platform()
    assert rope_fusion(parse_args(rope, world_size=1), te_gpu)
    assert not rope_fusion(parse_args([*rope, "--no-rope-fusion"], world_size=1), te_gpu)
    assert not rope_fusion(parse_args(TINY_GPT, world_size=1), te_gpu)  # learned positions
    assert not rope_fusion(parse_args(rope, world_size=1), bare_gpu)
    assert not transformer_config(parse_args(rope, world_size=1), cpu).apply_rope_fusion
