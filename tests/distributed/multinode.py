"""Shared pieces of the two-node tests: an emulated cluster of 2 nodes x 2 ranks, the training
flags every two-node run uses, and torchrun across the nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launch.emulate_cluster import EmulatedCluster, NodeExits
from tests.conftest import REPO, TINY_GPT, _base_env

TRAIN_ITERS = 20
# TINY_GPT with one micro-batch of 2 per rank at DP4 (4 in one process): global batch 8.
FLAGS = [*TINY_GPT, "--micro-batch-size", "2", "--train-iters", str(TRAIN_ITERS),
         "--log-interval", "1"]

TORCHRUN = ('exec "$0" -m torch.distributed.run --nnodes "$NNODES" --node-rank "$NODE_RANK" '
            '--nproc-per-node "$GPUS_PER_NODE" --master-addr "$MASTER_ADDR" '
            '--master-port "$MASTER_PORT" "$@"')


def torchrun_on_nodes(cluster: EmulatedCluster, args: list[str], log_dir: Path,
                      timeout: float = 600) -> tuple[NodeExits, str]:
    """pretrain_gpt.py under torchrun on every node; (exits, both nodes' output)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    exits = cluster.run_on_nodes(
        ["sh", "-c", TORCHRUN, sys.executable, str(REPO / "pretrain_gpt.py"), *args],
        env=_base_env(), log_dir=log_dir, timeout=timeout, failure_timeout=30)
    logs = "\n".join((log_dir / f"node{n.index}.log").read_text() for n in cluster.nodes)
    return exits, logs


def losses_by_iteration(save_dir: Path) -> dict[int, float]:
    """Each iteration's loss at full precision; the last record wins (a resumed run logs the
    iterations after its checkpoint again)."""
    out: dict[int, float] = {}
    for line in (save_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "train":
            out[record["iteration"]] = record["loss"]
    return out
