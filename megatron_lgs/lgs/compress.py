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
import torch.distributed as dist

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


def int8_message(piece: torch.Tensor, send_res: torch.Tensor, gather_res: torch.Tensor,
                 block: int, group: dist.ProcessGroup, *, keep_shard: bool
                 ) -> tuple[torch.Tensor, int]:
    """One compressed inter-node message over `group`'s N ranks (qgZ): all-to-all of the INT8
    rows of `piece` ([N, L]) with their scales, FP32 sum of what arrived. `keep_shard`
    (distributed optimizer): the sum of this rank's row is the result ([L]); else the
    quantized sums are all-gathered so every rank, the owner too, uses the same dequantized
    values ([N, L]). Returns the result and the bytes this rank sent."""
    n = group.size()
    q, scales = quantize_with_feedback(piece.float(), send_res, block)
    q_in, s_in = torch.empty_like(q), torch.empty_like(scales)
    dist.all_to_all_single(q_in, q, group=group)
    dist.all_to_all_single(s_in, scales, group=group)
    mine = dequantize(q_in, s_in, block).sum(dim=0)
    sent = (n - 1) * (q.shape[1] + 4 * scales.shape[1])
    if keep_shard:
        return mine, sent
    q2, s2 = quantize_with_feedback(mine.unsqueeze(0), gather_res, block)
    q_all = torch.empty(n, q2.shape[1], dtype=q2.dtype, device=q2.device)
    s_all = torch.empty(n, s2.shape[1], dtype=s2.dtype, device=s2.device)
    dist.all_gather_into_tensor(q_all.view(-1), q2.view(-1), group=group)
    dist.all_gather_into_tensor(s_all.view(-1), s2.view(-1), group=group)
    return dequantize(q_all, s_all, block), 2 * sent
