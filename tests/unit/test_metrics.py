"""Console lines keep Megatron-LM's shape, so existing log parsers read them."""

from __future__ import annotations

import re

from megatron_lgs.arguments import parse_args
from megatron_lgs.metrics import training_log_line, validation_log_line
from megatron_lgs.model import flops_per_token

# The field patterns Megatron-LM log parsers match on.
MEGATRON_FIELDS = [
    r"iteration\s+(\d+)/\s*(\d+) \|",
    r"consumed samples:\s+(\d+) \|",
    r"elapsed time per iteration \(ms\): ([\d.]+) \|",
    r"learning rate: ([\d.E+-]+) \|",
    r"global batch size:\s+(\d+) \|",
    r"lm loss: (\d\.\d{6}E[+-]\d\d) \|",
    r"loss scale: ([\d.]+) \|",
    r"grad norm: ([\d.]+) \|",
    r"number of skipped iterations:\s+(\d+) \|",
    r"number of nan iterations:\s+(\d+) \|",
]


def test_training_line_matches_megatron_parsers():
    line = training_log_line(
        iteration=20, train_iters=300, consumed_samples=320, ms_per_iteration=150.25,
        lr=2.5e-3, global_batch_size=16, loss=6.123456789, loss_scale=1.0, grad_norm=0.5,
        skipped=1, nan_iterations=0, tokens_per_second=12000.0, tflops_per_gpu=0.1, mfu=0.42)
    for pattern in MEGATRON_FIELDS:
        assert re.search(pattern, line), pattern
    assert re.search(r"lm loss: 6\.123457E\+00 \|", line)
    assert "tokens per second: 12000.0 |" in line and "MFU: 42.0% |" in line


def test_mfu_is_left_out_without_a_known_peak():
    line = training_log_line(
        iteration=1, train_iters=2, consumed_samples=8, ms_per_iteration=1.0, lr=1e-3,
        global_batch_size=8, loss=1.0, loss_scale=1.0, grad_norm=None, skipped=0,
        nan_iterations=0, tokens_per_second=1.0, tflops_per_gpu=0.0, mfu=None)
    assert "MFU" not in line and "grad norm: nan |" in line


def test_validation_line():
    assert validation_log_line(50, 2.0) == (
        " validation loss at iteration 50 | lm loss value: 2.000000E+00 | "
        "lm loss PPL: 7.389056E+00 |")


def test_flops_per_token_is_six_times_matmul_parameters_plus_attention():
    cfg = parse_args(["--num-layers", "2", "--hidden-size", "64", "--seq-length", "32"],
                     world_size=1)
    h, s, v = 64, 32, 1000
    matmul_params = 2 * (4 * h * h + 2 * h * 4 * h) + h * v
    assert flops_per_token(cfg, v) == 6 * matmul_params + 6 * 2 * (2 * s * h)
    # Heads wider than hidden / heads (--kv-channels): Q, K, V, the projection and the scores
    # follow the query width 4 x 32 = 128; K and V the 2 query groups' 64.
    wide = parse_args(["--num-layers", "2", "--hidden-size", "64", "--seq-length", "32",
                       "--num-attention-heads", "4", "--kv-channels", "32",
                       "--group-query-attention", "--num-query-groups", "2"], world_size=1)
    q, kv = 128, 64
    matmul_params = 2 * (2 * h * q + 2 * h * kv + 2 * h * 4 * h) + h * v
    assert flops_per_token(wide, v) == 6 * matmul_params + 6 * 2 * (2 * s * q)
