"""On a GPU: a checkpoint saved there resumes bit-exactly there, and loads on the CPU, which
continues within fp32 rounding of the GPU's own continuation. Skipped where CUDA is absent."""

from __future__ import annotations

import shutil

from tests.gpu.runs import LOCAL, max_difference, needs_cuda, run_on

pytestmark = needs_cuda

RUN = ["--train-iters", "6", "--log-interval", "1", "--eval-iters", "0"]


def test_gpu_checkpoint_resumes_bitwise_and_loads_on_cpu(tiny, tmp_path, figures):
    args = [*tiny, *LOCAL, *RUN]
    full = run_on("cuda", args, tmp_path / "full").losses()
    part = tmp_path / "part"
    run_on("cuda", [*args, "--exit-interval", "3"], part)
    on_cpu = tmp_path / "cpu"
    shutil.copytree(part, on_cpu)
    resumed = run_on("cuda", [*args, "--load", str(part)], part)
    assert "loaded checkpoint" in resumed.stdout
    gpu_tail = resumed.losses()[-3:]
    cpu_run = run_on("cpu", [*args, "--load", str(on_cpu)], on_cpu)
    assert "checkpoint saved on cuda, resumed on cpu" in cpu_run.stdout, cpu_run.stdout[-2000:]
    cpu_tail = cpu_run.losses()[-3:]
    figures("GPU resume == uninterrupted GPU run (iterations 4-6)", gpu_tail == full[3:])
    figures("largest |CPU continuation - GPU| loss difference", max_difference(cpu_tail, full[3:]))
    assert gpu_tail == full[3:], (gpu_tail, full)
    assert max_difference(cpu_tail, full[3:]) <= 1e-4, (cpu_tail, full)
