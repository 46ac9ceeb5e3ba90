import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from corpus_helpers import VOCAB_SIZE, prepare_corpus, write_bad_directory

from data_pipeline.__main__ import main
from data_pipeline.manifest import load_manifest
from data_pipeline.normalize import NormalizeConfig, normalize
from data_pipeline.prepare import DEDUP_REPORT, REJECTS_FILE
from data_pipeline.shard_reader import DocumentStore
from data_pipeline.sources import InputError
from data_pipeline.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[3]


def shard_samples(dataset_dir):
    manifest = json.loads((dataset_dir / "manifest.json").read_text())
    urls = [str(dataset_dir / s["tar"]) for s in manifest["shards"]]
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def test_counts_balance_per_domain(prepared):
    counts = prepared.manifest["counts"]
    assert prepared.manifest["domains"] == ["books", "code", "web"]
    for name, c in counts.items():
        removed = c["exact_duplicates"] + c["near_duplicates"] + sum(c["rejected"].values())
        assert c["records_in"] == c["kept"] + removed, name
    assert [counts[d]["records_in"] for d in ("books", "code", "web")] == [60, 60, 123]
    assert counts["web"]["exact_duplicates"] == 1 and counts["web"]["near_duplicates"] == 2
    summary = prepared.summary()
    print(summary)
    assert summary.splitlines()[-1].split()[:7] == ["all", "243", "240", "1", "2", "0",
                                                    str(sum(c["tokens"] for c in counts.values()))]


def test_shards_are_webdataset_and_index_points_at_tokens(prepared, corpus):
    out = prepared.output
    manifest = load_manifest(out, verify_shards=True)
    assert len(manifest["shards"]) == 4  # 240 documents, 64 per shard
    samples = shard_samples(out)
    store = DocumentStore([out])
    assert len(samples) == len(store) == 240
    for row, sample in enumerate(samples):
        tokens = np.frombuffer(sample["tokens.i32"], dtype="<i4")
        assert np.array_equal(store.read(row), tokens)
        assert store.domain_names[store.domain[row]] == sample["domain.txt"].decode()
    # Tokens decode back to the normalized text of the document named by source_id.
    tokenizer = load_tokenizer(out / "tokenizer.json")
    first_web = next(s for s in samples if s["source_id.txt"] == b"a.jsonl:1")
    text = json.loads((corpus.root / "web" / "a.jsonl").read_text().splitlines()[0])["text"]
    decoded = tokenizer.decode(np.frombuffer(first_web["tokens.i32"], "<i4").tolist())
    assert decoded == normalize(text, NormalizeConfig())
    assert manifest["tokenizer"]["vocab_size"] == VOCAB_SIZE
    # Plain ustar members: no pax header per member (a float mtime would add one to each).
    with tarfile.open(out / manifest["shards"][0]["tar"]) as tar:
        members = tar.getmembers()
    assert len(members) == 3 * manifest["shards"][0]["documents"]
    assert not any(m.pax_headers for m in members)
    assert {m.mtime for m in members} == {0}


def test_duplicates_removed_within_and_across_domains(prepared, corpus):
    report = [json.loads(line) for line in
              (prepared.output / DEDUP_REPORT).read_text().splitlines()]
    removed = {(r["removed_domain"], r["removed"]): r for r in report}
    assert len(removed) == len(report) == 3
    exact = removed[("web", corpus.exact_copy[0])]
    assert (exact["stage"], exact["kept"], exact["jaccard"]) == ("exact", corpus.exact_copy[1], 1.0)
    near = removed[("web", corpus.near_copy[0])]
    assert (near["stage"], near["kept"], near["kept_domain"]) == ("near", corpus.near_copy[1],
                                                                  "web")
    assert 0.85 < near["jaccard"] < 1.0 and 0.85 < near["matched_jaccard"] < 1.0
    cross = removed[("web", corpus.cross_domain_copy[0])]
    assert (cross["kept"], cross["kept_domain"]) == (corpus.cross_domain_copy[1], "code")
    kept = {(s["domain.txt"].decode(), s["source_id.txt"].decode())
            for s in shard_samples(prepared.output)}
    for row in report:
        assert (row["removed_domain"], row["removed"]) not in kept
        assert (row["kept_domain"], row["kept"]) in kept


def test_same_input_same_fingerprint(prepared, corpus, tmp_path):
    again = prepare_corpus(corpus, tmp_path / "again")
    assert again.manifest["fingerprint"] == prepared.manifest["fingerprint"]
    assert (tmp_path / "again" / "shard-000000.tar").read_bytes() == \
        (prepared.output / "shard-000000.tar").read_bytes()


def test_existing_output_is_refused(corpus, prepared):
    with pytest.raises(InputError, match="already exists"):
        prepare_corpus(corpus, prepared.output)


def test_train_tokenizer_then_prepare_with_it(corpus, tmp_path, capsys):
    web = [f"--domain=web={corpus.root / 'web'}"]
    assert main(["train-tokenizer", *web, "--vocab-size", "300",
                 "--output", str(tmp_path / "tok.json")]) == 0
    assert main(["prepare", *web, "--tokenizer", str(tmp_path / "tok.json"),
                 "--output", str(tmp_path / "ds"), "--no-near-dedup"]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 shards" in out
    manifest = load_manifest(tmp_path / "ds")
    assert manifest["tokenizer"]["vocab_size"] == 300
    assert manifest["counts"]["web"]["near_duplicates"] == 0  # near dedup was off
    assert manifest["counts"]["web"]["exact_duplicates"] == 1


def test_bad_input_is_counted_not_fatal(tmp_path):
    expected = write_bad_directory(tmp_path / "bad")
    proc = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "prepare", "--domain", f"bad={tmp_path / 'bad'}",
         "--output", str(tmp_path / "out"), "--vocab-size", "300"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Failed to read" not in proc.stdout + proc.stderr  # no library log of a bad parquet
    counts = load_manifest(tmp_path / "out")["counts"]["bad"]
    kept = expected.pop("kept")
    assert counts["kept"] == kept and counts["rejected"] == expected
    assert counts["records_in"] == kept + sum(expected.values())
    for reason, n in expected.items():
        assert f"{reason}={n}" in proc.stdout
    samples = [json.loads(line) for line in (tmp_path / "out" / REJECTS_FILE).read_text()
               .splitlines()]
    assert {s["reason"] for s in samples} == set(expected)
    trunc = next(s for s in samples if s["source_id"].startswith("trunc.tar"))
    assert trunc["location"].endswith("trunc.tar:2")


def test_strict_stops_at_first_input_error(tmp_path, capsys):
    write_bad_directory(tmp_path / "bad")
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--domain", f"bad={tmp_path / 'bad'}", "--output",
              str(tmp_path / "out"), "--vocab-size", "300", "--strict"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    # blank.txt (a filter decision) sorts first; broken.jsonl line 2 is the first input error.
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {tmp_path / 'bad' / 'broken.jsonl'}:2: malformed_json")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.work*")) and not (tmp_path / ".out.lock").exists()


def test_unwritable_outputs_and_bad_tokenizers_are_one_line(corpus, tmp_path, capsys):
    """An --output under a file, and a --tokenizer that is no tokenizer, are refused in one
    line before any work (they were tracebacks: from the lock file, from tokenizers' save after
    the training, from a stage worker), and nothing is left beside the output."""
    web = [f"--domain=web={corpus.root / 'web'}"]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (["prepare", *web, "--vocab-size", "300", "--output", str(tmp_path / "afile" / "ds")],
         1, "cannot write there"),
        (["train-tokenizer", *web, "--vocab-size", "300",
          "--output", str(tmp_path / "afile" / "tok.json")], 1, "cannot write there"),
        (["prepare", *web, "--tokenizer", str(tmp_path / "bad.json"),
          "--output", str(tmp_path / "ds")], 2, "bad.json: not a tokenizer.json"),
    ]
    for argv, code, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == code and len(err.splitlines()) == 1, err
        assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "bad.json"]


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--domain", "nameonly"], 2, "NAME=PATH"),
    (["--domain", "a=/nonexistent/dir"], 1, "no files found"),
    (["--domain", "a=.", "--threshold", "1.5"], 2, "threshold"),
    (["--domain", "a=.", "--bands", "20", "--rows", "8"], 2, "bands x rows"),
    (["--domain", "a=.", "--vocab-sample-bytes", "-1"], 2, "--vocab-sample-bytes"),
])
def test_bad_flags_one_line(argv, code, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", *argv, "--output", str(tmp_path / "o"), "--vocab-size", "300"])
    assert exit_info.value.code == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_verify_names_every_shard_changed_in_place(prepared, tmp_path, capsys):
    assert main(["verify", str(prepared.output)]) == 0
    assert "every sha256 matches" in capsys.readouterr().out
    copy = tmp_path / "copy"
    shutil.copytree(prepared.output, copy)
    tars = sorted(copy.glob("shard-*.tar"))
    for tar in tars[:2]:  # same size, one byte different: the trainer's checks cannot see it
        data = bytearray(tar.read_bytes())
        data[1000] ^= 0xFF
        tar.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(prepared.output), str(copy)])
    captured = capsys.readouterr()
    assert exc.value.code == 1
    assert "2 differ from manifest.json" in captured.out
    assert f"for 2 file(s): {tars[0]}, {tars[1]}" in captured.err
