"""``prepare --executor slurm`` on the real single-node Slurm cluster of test_slurm.py: one job
array per stage chained with afterok gives the local executor's output byte for byte; bad input
is counted the same way; a failing task (--strict) fails the run naming its log, and no
dataset appears."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from data_pipeline.sources import DomainSource
from tests.distributed.slurm_cluster import SlurmCluster
from tests.unit.data_pipeline.corpus_helpers import STAGED as FLAGS
from tests.unit.data_pipeline.corpus_helpers import (
    VOCAB_SIZE,
    digests,
    prepare_corpus,
    write_bad_directory,
    write_corpus,
)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(slurm_single):
    return slurm_single


def prepare_on_slurm(cluster: SlurmCluster, domains: list[str], output: Path, *extra: str
                     ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_pipeline", "prepare", *domains, "--output", str(output),
         "--executor", "slurm", "--slurm-partition", "debug", "--slurm-time", "10", *extra],
        cwd=REPO, env={**cluster.env, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=900)


def test_slurm_output_equals_local_and_failures_name_the_log(cluster):
    # One corpus with a domain of every kind of bad input: the Slurm run must equal the local
    # one byte for byte and count the bad input the same way.
    root = cluster.root / "data"
    corpus = write_corpus(root / "src")
    expected = write_bad_directory(root / "bad")
    with_bad = replace(corpus, sources=(*corpus.sources, DomainSource("bad", str(root / "bad"))))
    local = prepare_corpus(with_bad, root / "local", **FLAGS)
    domains = [f"--domain={s.domain}={s.pattern}" for s in with_bad.sources]
    proc = prepare_on_slurm(cluster, domains, root / "slurm", "--vocab-size", str(VOCAB_SIZE),
                            "--shard-max-docs", "64", "--partition-bytes",
                            str(FLAGS["partition_bytes"]), "--output-format", "megatron")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert digests(root / "slurm") == digests(local.output)
    counts = json.loads((root / "slurm" / "manifest.json").read_text())["counts"]["bad"]
    kept = expected.pop("kept")
    assert counts["rejected"] == expected and counts["kept"] == kept

    bad = [f"--domain=bad={root / 'bad'}", "--vocab-size", "300", "--partition-bytes", "200"]
    logs = root / "logs"
    proc = prepare_on_slurm(cluster, [*bad, "--strict", "--slurm-log-dir", str(logs)],
                            root / "strict-out")
    err = proc.stderr.strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1, err
    # The read task holding broken.jsonl fails first; the line names its log, whose last
    # line names the file and line.
    task = re.match(r"error: stage read task (\d+) failed", err)
    assert task, err
    assert f"log {logs / f'read-{task[1]}.log'}: error: {root / 'bad' / 'broken.jsonl'}:2: " \
           f"malformed_json" in err
    assert not (root / "strict-out").exists()
