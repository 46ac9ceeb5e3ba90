"""Train with pretrain_gpt.py's functions and report where the LGS engine reduced each bucket:
the thread, and whether the CUDA stream current during the reduction was the engine's
communication stream (it waits there on the event recorded when the bucket became ready).

    python tests/gpu/lgs_probe.py --lgs [pretrain_gpt.py flags]   -> "LGS probe: {json}"
"""

from __future__ import annotations

import json
import sys
import threading

import torch

import megatron_lgs  # noqa: F401  (the platform before megatron-core)
import pretrain_gpt
from megatron_lgs.arguments import parse_args
from megatron_lgs.lgs import sync
from megatron_lgs.training import pretrain

_SEEN: list[dict] = []
_reduce_bucket = sync.LgsEngine._reduce_bucket


def _traced(self: sync.LgsEngine, bs, k: int) -> None:
    where = {"thread": threading.current_thread().name}
    if self.cuda:
        where.update(stream=torch.cuda.current_stream().cuda_stream,
                     comm=self.comm_stream.cuda_stream,
                     default=torch.cuda.default_stream().cuda_stream)
    _SEEN.append(where)
    _reduce_bucket(self, bs, k)


def summary(seen: list[dict]) -> dict[str, object]:
    return {"reductions": len(seen), "threads": sorted({s["thread"] for s in seen}),
            "on_comm_stream": sum("stream" in s and s["stream"] == s["comm"] for s in seen),
            "on_default_stream": sum("stream" in s and s["stream"] == s["default"]
                                     for s in seen)}


if __name__ == "__main__":
    sync.LgsEngine._reduce_bucket = _traced
    pretrain(parse_args(sys.argv[1:]), pretrain_gpt.model_provider, pretrain_gpt.forward_step,
             pretrain_gpt.datasets_provider)
    print("LGS probe: " + json.dumps(summary(_SEEN)), flush=True)
