"""launch/slurm/pretrain_gpt.sbatch on a real two-node Slurm cluster: one slurmd in each network
namespace of an emulated cluster (2 nodes x 2 ranks, 1 Gbit/s links), slurmctld beside node 0's;
and data preparation's Slurm executor on the same cluster.

- a job trains, is preempted (`scancel --batch --signal=TERM`, what Slurm's --signal=B:TERM@120
  does before a time limit), saves, requeues itself and resumes on both nodes to the losses of
  an uninterrupted two-node run, bit for bit;
- a node lost mid-run (every rank in its namespace SIGKILLed): the job ends within 60 s with a
  line naming the node, the last complete checkpoint is intact, and a new two-node job resumes
  from it bit for bit;
- the preemption path five times in a row, all requeued and finished (the suite once saw 1 run
  in 4 end FAILED; the cause was the fixture releasing Slurm's requeue hold within the second
  of the requeue, see `SlurmCluster.hurry_requeued`). These repetitions use a stand-in rank
  (tests/distributed/preempt_rank.py) so that each costs seconds, not a training run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.distributed.multinode import FLAGS, TRAIN_ITERS, losses_by_iteration
from tests.distributed.slurm_cluster import (
    SlurmCluster,
    ensure_installed,
    make_root,
    python_for_jobs,
)

pytestmark = pytest.mark.slow

SBATCH = "launch/slurm/pretrain_gpt.sbatch"
NODE_LOST_TIMEOUT_S = 60  # a job that lost a node ends within this (srun --kill-on-bad-exit)


@pytest.fixture(scope="module")
def slurm2(emulated_2x2) -> Iterator[SlurmCluster]:
    ensure_installed()
    root = make_root("lgs-slurm2-")
    try:
        with SlurmCluster.on(emulated_2x2, root) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _env(save: Path, **extra: str) -> dict[str, str]:
    return {"SAVE": str(save), "CONFIG": "tiny-cpu", "PYTHON": python_for_jobs(),
            "GLOO_SOCKET_IFNAME": "ecl0", **extra}


def _train_records(save: Path) -> int:
    metrics = save / "metrics.jsonl"
    return metrics.read_text().count('"event": "train"') if metrics.exists() else 0


def _wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _wait_requeued_and_finished(cluster: SlurmCluster, job: str) -> dict[str, str]:
    deadline = time.monotonic() + 600
    while True:
        fields = cluster.job(job)
        assert fields.get("JobState") not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), \
            fields
        if fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1":
            return fields
        cluster.hurry_requeued(fields)
        assert time.monotonic() < deadline, fields
        time.sleep(0.3)


def _logs(root: Path, pattern: str) -> str:
    return "\n".join(p.read_text() for p in sorted(root.glob(pattern)))


def test_two_node_job_is_preempted_requeues_and_resumes_bit_exactly(slurm2, two_node_dp4,
                                                                    data_cache):
    save = slurm2.root / "ckpt-preempt"
    job = slurm2.submit("--nodes=2", "--ntasks-per-node=2",
                        f"--output={slurm2.root}/preempt-%j.out", SBATCH, *FLAGS,
                        "--data-cache-dir", data_cache, env=_env(save))
    _wait_for(lambda: _train_records(save) >= 3, "training never started")
    slurm2.run("scancel", "--batch", "--signal=TERM", job)
    fields = _wait_requeued_and_finished(slurm2, job)
    logs = _logs(slurm2.root, "preempt-*.out")
    assert fields["NodeList"] == "node[0-1]"
    # Rendezvous from `scontrol show hostnames`: the first node hosts the store.
    assert "4 ranks on 2 node(s), master node0:" in logs
    assert "restart 1, 4 ranks on 2 node(s)" in logs
    assert "received SIGTERM" in logs and "preempted; requeueing" in logs
    resumed_at = int(logs.split(f"loaded checkpoint from {save} at iteration ")[1].split()[0])
    assert 3 <= resumed_at < TRAIN_ITERS
    assert (save / "latest_checkpointed_iteration.txt").read_text() == str(TRAIN_ITERS)
    reference, _ = two_node_dp4
    assert losses_by_iteration(save) == reference  # bit for bit, across the preemption


def _rank_pids(cluster, node) -> list[int]:
    pids = []
    for pid in cluster.pids(node):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"pretrain_gpt.py" in cmdline:
            pids.append(pid)
    return pids


def test_lost_node_ends_the_job_and_a_new_job_resumes_from_the_last_checkpoint(
        slurm2, emulated_2x2, two_node_dp4, data_cache):
    save = slurm2.root / "ckpt-lost"
    args = [SBATCH, *FLAGS, "--data-cache-dir", data_cache, "--save-interval", "2"]
    job = slurm2.submit("--nodes=2", "--ntasks-per-node=2",
                        f"--output={slurm2.root}/lost-%j.out", *args,
                        env=_env(save, MAX_RESTARTS="0"))
    tracker = save / "latest_checkpointed_iteration.txt"
    _wait_for(lambda: tracker.exists() and int(tracker.read_text()) >= 4
              and _train_records(save) >= 5, "no checkpoint at iteration 4")
    node1 = emulated_2x2.nodes[1]
    ranks = _rank_pids(emulated_2x2, node1)
    assert len(ranks) == 2, ranks
    lost_at = time.monotonic()
    for pid in ranks:  # the ranks only: slurmd and its step daemon see them die
        os.kill(pid, signal.SIGKILL)
    state, code = slurm2.wait(job, timeout=NODE_LOST_TIMEOUT_S + 60)
    took = time.monotonic() - lost_at
    logs = _logs(slurm2.root, "lost-*.out")
    assert state == "FAILED" and code != "0:0", (state, code, logs[-3000:])
    assert took <= NODE_LOST_TIMEOUT_S, took
    assert re.search(r"node1: tasks? [0-9-]+: Killed", logs), logs[-3000:]
    kept = int(tracker.read_text())
    assert kept >= 4 and (save / f"iter_{kept:07d}").is_dir()

    job = slurm2.submit("--nodes=2", "--ntasks-per-node=2",
                        f"--output={slurm2.root}/lost-%j.out", *args, env=_env(save))
    assert slurm2.wait(job) == ("COMPLETED", "0:0"), _logs(slurm2.root, "lost-*.out")[-3000:]
    logs = _logs(slurm2.root, "lost-*.out")
    assert f"loaded checkpoint from {save} at iteration {kept}" in logs
    reference, _ = two_node_dp4
    assert losses_by_iteration(save) == reference


@pytest.mark.parametrize("repetition", range(5))
def test_preemption_requeues_and_finishes_every_time(slurm2, repetition):
    folder = slurm2.root / f"standin-{repetition}"
    folder.mkdir()
    python = folder / "python"  # what the script runs as "$PYTHON" pretrain_gpt.py ...
    python.write_text(f"#!/bin/sh\nexec {sys.executable} "
                      f"{REPO / 'tests/distributed/preempt_rank.py'} \"$@\"\n")
    python.chmod(0o755)
    job = slurm2.submit("--nodes=2", "--ntasks-per-node=2", f"--output={folder}/out", SBATCH,
                        env=_env(folder / "save", PYTHON=str(python), STANDIN_DIR=str(folder)))
    _wait_for(lambda: len(list(folder.glob("ready*"))) == 4, "stand-in ranks never started", 60)
    slurm2.run("scancel", "--batch", "--signal=TERM", job)
    _wait_requeued_and_finished(slurm2, job)
    assert len(list(folder.glob("saved*"))) == 4  # every rank got the TERM and "saved"
    assert len(list(folder.glob("finished*"))) == 4  # and every rank ran again after the requeue
    assert "preempted; requeueing" in (folder / "out").read_text()


def test_prepare_on_two_slurm_nodes_equals_the_local_output(slurm2):
    """`prepare --executor slurm` submitted from node 0: the stages' job arrays run on both
    nodes (each task's log names its node) and the dataset is the local executor's, byte for
    byte."""
    import subprocess

    from tests.unit.data_pipeline.corpus_helpers import STAGED, VOCAB_SIZE, digests, write_corpus
    from tests.unit.data_pipeline.corpus_helpers import prepare_corpus as prepare_here

    root = slurm2.root / "prepare"
    corpus = write_corpus(root / "src")
    local = prepare_here(corpus, root / "local", **STAGED)
    logs = root / "logs"
    proc = subprocess.run(
        [*slurm2.nodes[0].prefix, sys.executable, "-m", "data_pipeline", "prepare",
         *[f"--domain={s.domain}={s.pattern}" for s in corpus.sources],
         "--output", str(root / "slurm"), "--executor", "slurm", "--slurm-partition", "debug",
         "--slurm-time", "10", "--slurm-log-dir", str(logs), "--vocab-size", str(VOCAB_SIZE),
         "--shard-max-docs", "64", "--partition-bytes", str(STAGED["partition_bytes"]),
         "--output-format", "megatron"],
        cwd=REPO, env={**slurm2.env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=900)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert digests(root / "slurm") == digests(local.output)
    ran_on = {m.group(1) for log in logs.glob("*.log")
              for m in re.finditer(r" on node (\S+)", log.read_text())}
    assert ran_on == {n.name for n in slurm2.nodes}, ran_on
