"""INT8 quantization error bound and error feedback."""

from __future__ import annotations

import torch

from megatron_lgs.lgs.compress import dequantize, quantize, quantize_with_feedback


def test_error_is_within_half_a_quantization_step():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1000, generator=g) * torch.logspace(-4, 2, 1000)
    q, scales = quantize(x, block=64)
    assert q.dtype == torch.int8 and scales.shape == (3, 16)
    step = scales.repeat_interleave(64, dim=1)[:, :1000]
    error = (dequantize(q, scales, 64) - x).abs()
    assert (error <= step / 2 + 1e-7 * x.abs()).all()
    assert error.max() > 0  # it really is lossy


def test_zero_blocks_stay_zero():
    x = torch.zeros(1, 300)
    q, scales = quantize(x, 128)
    assert (dequantize(q, scales, 128) == 0).all()


def test_error_feedback_sent_plus_residual_equals_the_true_sum():
    g = torch.Generator().manual_seed(1)
    residual = torch.zeros(2, 513)
    sent_sum = torch.zeros(2, 513, dtype=torch.float64)
    true_sum = torch.zeros(2, 513, dtype=torch.float64)
    for _ in range(50):
        x = torch.randn(2, 513, generator=g)
        q, scales = quantize_with_feedback(x, residual, 256)
        sent_sum += dequantize(q, scales, 256).double()
        true_sum += x.double()
    assert torch.allclose(sent_sum + residual.double(), true_sum, atol=1e-4)
    # without feedback the error would have accumulated: the residual is bounded by one step
    assert residual.abs().max() < 0.05
