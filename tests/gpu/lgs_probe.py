"""Train with pretrain_gpt.py's functions and report where the LGS engine reduced each bucket:
the thread of each hop (intra-node, inter-node), and whether the CUDA stream current during
it was that hop's stream (each waits there on the event recorded before it).

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
_on_stream = sync.LgsEngine._on_stream


def _traced(self: sync.LgsEngine, hop: str, wait_for):
    """Each bucket enters each hop's stream once; note where it is once inside."""
    inner = _on_stream(self, hop, wait_for)

    class _Probe:
        def __enter__(self_probe) -> None:
            inner.__enter__()
            where = {"hop": hop, "thread": threading.current_thread().name}
            if self.cuda:
                where.update(stream=torch.cuda.current_stream().cuda_stream,
                             comm=self.streams[hop].cuda_stream,
                             default=torch.cuda.default_stream().cuda_stream)
            _SEEN.append(where)

        def __exit__(self_probe, *exc) -> None:
            inner.__exit__(*exc)
    return _Probe()


def summary(seen: list[dict]) -> dict[str, object]:
    return {"reductions": sum(s["hop"] == "intra-node" for s in seen),
            "hops": len(seen), "threads": sorted({s["thread"] for s in seen}),
            "on_comm_stream": sum("stream" in s and s["stream"] == s["comm"] for s in seen),
            "on_default_stream": sum("stream" in s and s["stream"] == s["default"]
                                     for s in seen)}


if __name__ == "__main__":
    sync.LgsEngine._on_stream = _traced
    pretrain(parse_args(sys.argv[1:]), pretrain_gpt.model_provider, pretrain_gpt.forward_step,
             pretrain_gpt.datasets_provider)
    print("LGS probe: " + json.dumps(summary(_SEEN)), flush=True)
