"""ZeRO flags a run cannot honour stop in one line before any process group starts."""

from __future__ import annotations

import pytest

from tests.conftest import _base_env
from tests.forked_ranks import run_ranks


@pytest.mark.parametrize("argv, env, message", [
    (["--data-parallel-sharding-strategy", "optim_grads_params"], {},
     "--data-parallel-sharding-strategy is a Megatron-FSDP setting"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim"], {},
     "checkpoints save each rank's shard"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
      "--no-save", "--tensor-model-parallel-size", "2"],
     {"WORLD_SIZE": "2", "RANK": "0"}, "pure data parallelism"),
    (["--use-megatron-fsdp", "--no-save", "--optimizer", "sgd"], {},
     "supports only --optimizer adam"),
    (["--optimizer-cpu-offload"], {}, "--optimizer-cpu-offload needs --use-distributed-optimizer"),
    (["--optimizer-cpu-offload", "--use-distributed-optimizer", "--optimizer-offload-fraction",
      "0"], {}, "--optimizer-offload-fraction must be in (0, 1]"),
    (["--optimizer-cpu-offload", "--use-distributed-optimizer", "--no-save"], {},
     "its optimizer state already lives in host memory"),
])
def test_zero_flag_errors_are_one_line(argv, env, message):
    full_env = {**_base_env(), **env}
    full_env.pop("MASTER_ADDR", None)
    code, stdout, stderr = run_ranks("pretrain_gpt", argv, 1, full_env, timeout=120)
    assert code == 2, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("pretrain_gpt.py: error: ")
    assert message in lines[0]
