"""The staged prepare: byte-identical output for 1, 2 and 4 workers (real process pools) and
in-process; a run SIGKILLed in the signature stage resumes to the same output; a damaged task
output is redone; Megatron's format read back by megatron-core; bad input under a pool."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import STAGED as FLAGS
from corpus_helpers import VOCAB_SIZE, digests, prepare_corpus, write_bad_directory

from data_pipeline.executors.local import LocalExecutor
from data_pipeline.manifest import DatasetError, load_manifest
from data_pipeline.planted import planted_corpus
from data_pipeline.prepare import DEDUP_REPORT, PrepareConfig, prepare, work_dir
from data_pipeline.shard_reader import DocumentStore
from data_pipeline.sources import DomainSource
from data_pipeline.stages.common import Texts, task_dir
from data_pipeline.stages.vocab import sample_prefix

REPO = Path(__file__).resolve().parents[3]
def cli(corpus, output: Path, *extra: str) -> subprocess.Popen:
    domains = [f"--domain={s.domain}={s.pattern}" for s in corpus.sources]
    return subprocess.Popen(
        [sys.executable, "-m", "data_pipeline", "prepare", *domains, "--output", str(output),
         "--vocab-size", str(VOCAB_SIZE), "--shard-max-docs", "64", "--partition-bytes",
         str(FLAGS["partition_bytes"]), "--output-format", "megatron", *extra],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """In this process, one task after another."""
    return prepare_corpus(corpus, tmp_path_factory.mktemp("ref") / "ds", **FLAGS)


def test_plan_has_several_tasks_per_stage(reference):
    assert len(reference.manifest["shards"]) >= 4
    assert reference.manifest["config"]["partition_bytes"] == FLAGS["partition_bytes"]
    counts = reference.manifest["counts"]
    assert counts["web"]["exact_duplicates"] == 1 and counts["web"]["near_duplicates"] == 2


def test_dedup_report_has_one_row_per_removed_document(tmp_path):
    """Partitions of several tokenizer batches each, copies in other partitions than their
    originals: the report has one row per removed document (as many as the manifest counts,
    none twice), each the copy of a planted pair."""
    planted = planted_corpus(n_pairs=400, words=40, n_unrelated=400, seed=3)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(0, len(planted.texts), 300):  # one ~90 kB file, one partition, per 300
        (src / f"part{i // 300}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in planted.texts[i:i + 300]))
    prepare(PrepareConfig(sources=(DomainSource("web", str(src)),), output=tmp_path / "ds",
                          vocab_size=VOCAB_SIZE, partition_bytes=100_000, progress=False),
            LocalExecutor(0))
    counts = load_manifest(tmp_path / "ds")["counts"]["web"]
    rows = [json.loads(line) for line in
            (tmp_path / "ds" / DEDUP_REPORT).read_text(encoding="utf-8").splitlines()]
    removed = [r["removed"] for r in rows]
    assert len(removed) == counts["near_duplicates"] > 20
    assert len(set(removed)) == len(removed)
    assert counts["kept"] + len(removed) == counts["records_in"]
    copies = {f"part{c // 300}.jsonl:{c % 300}" for c in planted.pairs[:, 1].tolist()}
    assert set(removed) <= copies, sorted(set(removed) - copies)[:3]


@pytest.mark.slow
def test_identical_for_1_2_4_workers_and_resumes_after_sigkill(corpus, reference, tmp_path):
    expected = digests(reference.output)
    for workers in (2, 4):
        out = tmp_path / f"w{workers}"
        pool = LocalExecutor(workers)
        prepare_corpus(corpus, out, executor=pool, **FLAGS)
        assert digests(out) == expected, workers
        # A process per task; the one-task stages get every worker's CPU as threads.
        pids = [s["pid"] for stats in pool.stats.values() for s in stats]
        assert len(set(pids)) == len(pids)
        assert pool.stats["vocab"][0]["threads"] == workers
        writes = pool.stats["write"]
        assert {s["threads"] for s in writes} == {max(1, workers // len(writes))}

    # The command line with one worker, SIGKILLed once the signature stage has begun.
    out = tmp_path / "killed"
    work = work_dir(out.absolute())
    proc = cli(corpus, out, "--executor", "local", "--workers", "1")
    deadline = time.monotonic() + 300
    while not list((work / "signatures").glob("*.done")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in (work / "signatures").glob("*.done"))
    n_partitions = len(list((work / "read").glob("*.done")))
    assert 1 <= len(done) < n_partitions, "killed after the signature stage had finished"
    assert not out.exists()
    # Damage two finished outputs: a truncated read output, a flipped byte in a signature file.
    texts = work / "read" / "00001" / "texts.bin"
    texts.write_bytes(texts.read_bytes()[:-7])
    sig = work / "signatures" / done[0].removesuffix(".done") / "sig.npy"
    raw = bytearray(sig.read_bytes())
    raw[-1] ^= 0xFF
    sig.write_bytes(bytes(raw))

    executor = LocalExecutor(0)
    prepare_corpus(corpus, out, executor=executor, **FLAGS)
    ran = {stage: [i for i, s in enumerate(stats) if s is not None]
           for stage, stats in executor.stats.items()}
    assert ran["read"] == [1]  # the damaged one only: the rest were complete
    assert int(done[0][:5]) in ran["signatures"]
    assert len(ran["signatures"]) == n_partitions - len(done) + 1
    assert digests(out) == expected
    assert not work.exists()

    out1 = tmp_path / "cli1"
    proc = cli(corpus, out1, "--workers", "1")
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert digests(out1) == expected


def test_texts_reads_any_row_with_a_bounded_number_of_open_partitions(tmp_path):
    docs = [[f"p{p} doc {i} " + "é" * i for i in range(4)] for p in range(5)]
    for p, texts in enumerate(docs):
        root = task_dir(tmp_path, "read", p)
        root.mkdir(parents=True)
        data = [t.encode() for t in texts]
        (root / "texts.bin").write_bytes(b"".join(data))
        np.save(root / "offsets.npy", np.cumsum([0, *map(len, data)]))
    starts = np.arange(0, 24, 4)
    rows = [19, 0, 7, 13, 2, 19, 8, 1, 17, 6]
    with Texts(tmp_path, starts, max_open=2) as texts:
        got = texts.get(rows)
        assert len(texts._open) == 2
    assert got == [docs[r // 4][r % 4] for r in rows] and not texts._open


def test_vocab_sample_takes_the_first_documents_of_each_share():
    offsets = np.array([0, 10, 20, 30, 40])
    # 0.6 of 40 bytes is 24: the documents starting at 0, 10 and 20.
    assert sample_prefix(offsets, 0.6) == 3
    assert sample_prefix(offsets, 0.25) == 1 and sample_prefix(offsets, 0.26) == 2
    assert sample_prefix(offsets, 1.0) == 4 and sample_prefix(np.array([0]), 0.5) == 0


def test_a_vocab_sample_changes_only_the_tokenizer(corpus, reference, tmp_path):
    sampled = prepare_corpus(corpus, tmp_path / "sampled", vocab_sample_bytes=20_000, **FLAGS)
    assert sampled.manifest["config"]["vocab_sample_bytes"] == 20_000
    ref_tok = (reference.output / "tokenizer.json").read_bytes()
    assert (sampled.output / "tokenizer.json").read_bytes() != ref_tok
    assert sampled.manifest["counts"].keys() == reference.manifest["counts"].keys()
    for domain, counts in sampled.manifest["counts"].items():
        assert {k: v for k, v in counts.items() if k != "tokens"} == \
            {k: v for k, v in reference.manifest["counts"][domain].items() if k != "tokens"}


def test_megatron_prefixes_hold_the_shards_documents(reference):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    store = DocumentStore([reference.output])
    manifest = load_manifest(reference.output)
    for k, domain in enumerate(manifest["domains"]):
        data = IndexedDataset(str(reference.output / "megatron" / domain))
        docs = np.flatnonzero(store.domain == k)
        assert len(data.document_indices) - 1 == len(docs) == manifest["counts"][domain]["kept"]
        for seq, doc in enumerate(docs.tolist()):
            assert np.array_equal(data[seq], store.read(doc))
        # Read back through our own Megatron reader too (the --data-path path).
        prefix = DocumentStore([reference.output / "megatron" / domain])
        assert prefix.vocab_size == store.vocab_size and prefix.domain_names == [domain]
        assert all(np.array_equal(prefix.read(j), store.read(d))
                   for j, d in enumerate(docs.tolist()))


def test_a_truncated_megatron_bin_is_one_line(reference, tmp_path):
    domain = load_manifest(reference.output)["domains"][0]
    for ext in (".bin", ".idx"):
        shutil.copy(reference.output / "megatron" / f"{domain}{ext}", tmp_path / f"d{ext}")
    with open(tmp_path / "d.bin", "r+b") as f:  # megatron-core would map it and fail at a read
        f.truncate(f.seek(0, 2) // 2)
    with pytest.raises(DatasetError, match=r"d\.bin: \d+ bytes, its \.idx points to byte"):
        DocumentStore([tmp_path / "d"])


@pytest.mark.slow
def test_bad_input_under_a_pool(tmp_path):
    expected = write_bad_directory(tmp_path / "bad")
    base = [sys.executable, "-m", "data_pipeline", "prepare", "--domain",
            f"bad={tmp_path / 'bad'}", "--vocab-size", "300", "--partition-bytes", "200",
            "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([*base, "--output", str(tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    counts = load_manifest(tmp_path / "out")["counts"]["bad"]
    kept = expected.pop("kept")
    assert counts["kept"] == kept and counts["rejected"] == expected
    strict = subprocess.run([*base, "--output", str(tmp_path / "strict"), "--strict"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=600)
    err = strict.stderr.strip()
    assert strict.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {tmp_path / 'bad' / 'broken.jsonl'}:2: malformed_json")
    assert not (tmp_path / "strict").exists() and not work_dir(tmp_path / "strict").exists()


def test_verify_hashes_the_megatron_files_too(reference, tmp_path, capsys):
    from data_pipeline.__main__ import main

    copy = tmp_path / "copy"
    shutil.copytree(reference.output, copy)
    assert main(["verify", str(copy)]) == 0
    domain = load_manifest(copy)["domains"][0]
    data = copy / "megatron" / f"{domain}.bin"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(copy)])
    assert exc.value.code == 1 and f"for 1 file(s): {data}" in capsys.readouterr().err
