"""Gradient bookkeeping and optimizer passes: the HBM traffic around the GEMMs' gradients.

What the data-parallel wrapper and the optimizer move, counted from the code of the two
generations of Megatron the published runs used (every byte count is per parameter):

- megatron-core (`grad_buffer` true, the default; Megatron-LM r0.8 `distributed/`): weight
  gradients of the linear layers accumulate into the FP32 `main_grad` buffer inside the GEMM
  (`gradient_accumulation_fusion`, TE's `fuse_wgrad_accumulation`), so they cost no pass. The
  parameters without that fusion go through the backward hook `param.main_grad.add_(grad)`
  each micro-batch (read FP32 main grad and the BF16 grad, write the main grad: 2 g + 2 bytes,
  g the main grad's width); of them only the word embedding is large, and its backward first
  zero-fills a dense V / t x h gradient (2 bytes). Once per step `zero_grad_buffer` zeroes
  the whole local buffer (g), and `start_grad_sync` reads it for the NaN check
  (`check_for_nan_in_grad`, on by default: `grad_data.norm()`, g) and scales it by 1 / dp in
  place before the collective (2 g, only when dp > 1).
- Megatron-LM of April 2021 (`grad_buffer` false; `megatron/model/distributed.py` with
  `use_contiguous_buffers` off, its FP16 default, and PyTorch DDP): gradients stay in
  `param.grad` (FP16), so autograd adds every micro-batch after the first into it in place
  (read both, write one: 3 x 2 bytes); the all-reduce flattens them into one buffer, divides
  by dp and copies them back (3 x 2 x 2 bytes; PyTorch DDP's bucket copy in, division and copy
  out are the same passes).
- The optimizer, on this GPU's shard: the gradient norm reads the FP32 grads (4); FusedAdam
  reads the grad and reads and writes its state (4 + 2 x the run's `optimizer_state_bytes`:
  28 with Megatron's FP32 master and moments); the copy of the master to the BF16/FP16
  weights reads 4 and writes 2: 38 bytes with Megatron's state. FP16 adds the loss scale's
  unscale-and-inf-check pass over the FP32 grads (read + write, 8,
  `_unscale_main_grads_and_check_for_nan`); without the grad buffer the FP16 grads are first
  cast into FP32 main grads (read 2, write 4, `_copy_model_grads_to_main_grads`).
"""

from __future__ import annotations

from megatron_lgs.lgs.runspec import Run
from megatron_lgs.lgs.stepmemory import grad_bytes

MODEL_GRAD_BYTES = 2  # the gradient autograd produces: BF16 / FP16
ADAM_STEP_BYTES = 4 + 4 + 6  # grad norm, FusedAdam's grad read, master -> model weights copy
FP16_UNSCALE_BYTES = 8
FP32_CAST_BYTES = 2 + 4


def accumulate_bytes(r: Run, stage_params: float, embedding_params: float) -> float:
    """HBM bytes one micro-batch's backward spends accumulating a stage's gradients, averaged
    over the step's micro-batches (`embedding_params`: the word embedding this stage looks
    up, 0 beyond stage 0)."""
    w = MODEL_GRAD_BYTES
    dense_embedding = w * embedding_params  # zero-filled dense gradient of the lookup
    if r.grad_buffer:
        return dense_embedding + (2 * grad_bytes(r) + w) * embedding_params
    m = r.num_micro_batches
    return dense_embedding + 3 * w * stage_params * (m - 1) / m


def step_bytes(r: Run, local_params: float) -> float:
    """HBM bytes of the once-per-step passes over this GPU's gradient buffer."""
    reduced = r.dp * r.cp > 1
    if r.grad_buffer:
        return local_params * grad_bytes(r) * (2 + (2 if reduced else 0))
    return local_params * (3 * 2 * MODEL_GRAD_BYTES if reduced else 0)


def optimizer_bytes_per_param(r: Run) -> float:
    """HBM bytes per parameter of the optimizer's own shard."""
    n = ADAM_STEP_BYTES + 2 * r.optimizer_state_bytes
    if r.precision == "fp16":
        n += FP16_UNSCALE_BYTES
    if not r.grad_buffer:
        n += FP32_CAST_BYTES
    return n
