"""Reading a saved dist_checkpointing directory back in one process, for comparisons."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


def global_tensors(checkpoint: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a dist_checkpointing directory, gathered whole from its shards."""
    out = tmp / f"{checkpoint.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return {k: v for k, v in torch.load(out, weights_only=True).items()
            if isinstance(v, torch.Tensor)}
