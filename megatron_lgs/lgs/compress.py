"""INT8 gradient compression with per-block scales and error feedback.

Symmetric round-to-nearest: each block of `block` values shares one fp32 scale absmax/127, so
the error of an element is at most half a quantization step (scale / 2). Error feedback keeps
what was not sent: before quantizing, the residual of the previous step is added, and the new
residual is the difference between what should have been sent and what was. Summed over K
steps, the values sent plus the final residual equal the true values summed (up to fp32
round-off), so the compression error does not accumulate into the weights.
"""

from __future__ import annotations

import torch

QMAX = 127


def quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `x` ([R, L] fp32) -> (int8 [R, L], fp32 scales [R, ceil(L / block)])."""
    rows, length = x.shape
    nblocks = -(-length // block)
    padded = torch.nn.functional.pad(x, (0, nblocks * block - length))
    blocks = padded.view(rows, nblocks, block)
    scales = blocks.abs().amax(dim=2) / QMAX
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / safe.unsqueeze(2)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.view(rows, nblocks * block)[:, :length].contiguous(), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    rows, length = q.shape
    nblocks = scales.shape[1]
    padded = torch.nn.functional.pad(q.float(), (0, nblocks * block - length))
    return (padded.view(rows, nblocks, block) * scales.unsqueeze(2)).view(
        rows, nblocks * block)[:, :length]


def quantize_with_feedback(x: torch.Tensor, residual: torch.Tensor, block: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x + residual; `residual` (same shape as x) becomes what was not sent."""
    target = x + residual
    q, scales = quantize(target, block)
    residual.copy_(target - dequantize(q, scales, block))
    return q, scales
