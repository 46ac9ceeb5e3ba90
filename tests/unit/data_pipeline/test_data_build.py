import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import data_pipeline.dataset as dataset_module
from data_pipeline import (
    DataConfig,
    build_embedded_datasets,
    eod_id,
    load_embedded_corpus,
)
from data_pipeline.cache import STAGING_PREFIX, cache_key, publish_entry
from data_pipeline.tokenizer import train_bpe_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[3]
VOCAB = 512


def small_config(cache_dir, **kwargs):
    return DataConfig(
        seq_length=64, vocab_size=VOCAB, cache_dir=str(cache_dir), **kwargs
    )


def entry_dirs(cache_dir):
    return sorted(p.name for p in Path(cache_dir).iterdir())


@pytest.fixture(scope="module")
def corpus():
    return load_embedded_corpus()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("cache")
    cfg = small_config(cache_dir)
    return cfg, build_embedded_datasets(cfg)


def split_on_eod(stream, eod):
    ends = np.flatnonzero(np.asarray(stream) == eod)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [np.asarray(stream[s:e]) for s, e in zip(starts, ends, strict=True)]


def test_streams_and_tokenizer(built, corpus):
    cfg, (train, valid, tokenizer) = built
    assert tokenizer.get_vocab_size() == VOCAB
    for ds in (train, valid):
        assert isinstance(ds.tokens, np.memmap) and ds.tokens.dtype == np.int32
        assert ds.seq_length == cfg.seq_length and ds.seed == cfg.seed
        assert len(ds) == (len(ds.tokens) - 1) // cfg.seq_length
        assert ds.tokens.max() < VOCAB
    assert (train.name, valid.name) == ("train", "valid")
    assert train.fingerprint != valid.fingerprint
    assert len(valid.tokens) < len(train.tokens) / 5


def test_document_level_split_every_20th(built, corpus):
    cfg, (train, valid, tokenizer) = built
    docs = corpus.documents
    eod = eod_id(tokenizer)
    valid_docs = split_on_eod(valid.tokens, eod)
    train_docs = split_on_eod(train.tokens, eod)
    # Each stream ends with EOD and holds exactly its documents, in order.
    assert valid.tokens[-1] == eod and train.tokens[-1] == eod
    expected_valid = [d.text for d in docs[cfg.valid_every - 1 :: cfg.valid_every]]
    expected_train = [d.text for i, d in enumerate(docs, 1) if i % cfg.valid_every]
    assert [tokenizer.decode(t.tolist()) for t in valid_docs] == expected_valid
    assert len(train_docs) == len(expected_train)
    for i in (0, len(expected_train) // 2, len(expected_train) - 1):
        assert tokenizer.decode(train_docs[i].tolist()) == expected_train[i]


def test_cache_hit_reuses_entry_without_rebuilding(built, monkeypatch):
    cfg, (train, valid, tokenizer) = built

    def no_rebuild(*args, **kwargs):
        raise AssertionError("cache miss: entry was rebuilt")

    monkeypatch.setattr(dataset_module, "_build_entry", no_rebuild)
    start = time.perf_counter()
    train2, valid2, tokenizer2 = build_embedded_datasets(cfg)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0  # a cold build retrains; a hit only hashes the corpus
    assert np.array_equal(train2.tokens, train.tokens)
    assert np.array_equal(valid2.tokens, valid.tokens)
    assert tokenizer2.to_str() == tokenizer.to_str()
    assert (train2.fingerprint, valid2.fingerprint) == (
        train.fingerprint,
        valid.fingerprint,
    )
    for i in (0, 17, 10 * len(train)):
        assert np.array_equal(train2[i]["tokens"].numpy(), train[i]["tokens"].numpy())


def test_sampling_settings_share_one_entry(built, monkeypatch):
    cfg, (train, _, _) = built
    monkeypatch.setattr(dataset_module, "_build_entry", None)  # any rebuild would crash
    other_seed, _, _ = build_embedded_datasets(small_config(cfg.cache_dir, seed=99))
    other_len = build_embedded_datasets(
        DataConfig(seq_length=32, vocab_size=VOCAB, cache_dir=cfg.cache_dir)
    )[0]
    assert len(entry_dirs(cfg.cache_dir)) == 1
    assert len({train.fingerprint, other_seed.fingerprint, other_len.fingerprint}) == 3


def test_cache_key_depends_on_inputs(corpus):
    base = cache_key(corpus.fingerprint, 4096, 20)
    assert cache_key(corpus.fingerprint, 4096, 20) == base
    assert cache_key(corpus.fingerprint, 4097, 20) != base
    assert cache_key(corpus.fingerprint, 4096, 19) != base
    assert cache_key("0" * 64, 4096, 20) != base


def test_failed_write_publishes_nothing(tmp_path, monkeypatch):
    tokenizer = train_bpe_tokenizer(["abc abd abe"], 260)
    streams = {
        "train": np.arange(9, dtype=np.int32),
        "valid": np.arange(5, dtype=np.int32),
    }
    real_save = np.save

    def crash_on_second_stream(f, arr, *args, **kwargs):
        if len(arr) == 5:
            raise OSError("disk full")
        real_save(f, arr, *args, **kwargs)

    monkeypatch.setattr(np, "save", crash_on_second_stream)
    with pytest.raises(OSError, match="disk full"):
        publish_entry(tmp_path, "k", tokenizer, streams, {})
    # Neither a partial entry nor the staging directory survives.
    assert entry_dirs(tmp_path) == []
    monkeypatch.setattr(np, "save", real_save)
    entry = publish_entry(tmp_path, "k", tokenizer, streams, {})
    assert np.array_equal(entry.streams["valid"], np.arange(5))


def test_losing_a_publish_race_returns_the_winner(tmp_path):
    tokenizer = train_bpe_tokenizer(["abc abd abe"], 260)
    winner = publish_entry(
        tmp_path, "k", tokenizer, {"train": np.arange(5, dtype=np.int32)}, {}
    )
    loser = publish_entry(
        tmp_path, "k", tokenizer, {"train": np.arange(9, dtype=np.int32)}, {}
    )
    assert np.array_equal(loser.streams["train"], np.arange(5))
    assert loser.path == winner.path
    assert entry_dirs(tmp_path) == ["k"]
    assert isinstance(loser.tokenizer, Tokenizer)


def test_concurrent_builds_agree_despite_leftover_staging(tmp_path, built):
    cfg, (train, valid, _) = built
    key = cache_key(load_embedded_corpus().fingerprint, VOCAB, cfg.valid_every)
    # What a process killed mid-write leaves behind.
    stale = tmp_path / f"{STAGING_PREFIX}{key}-12345-deadbeef"
    stale.mkdir()
    (stale / "train.npy").write_bytes(b"\x93NUMPY truncated")
    (stale / "tokenizer.json").write_text("{", encoding="utf-8")
    script = (
        "from data_pipeline import DataConfig, build_embedded_datasets\n"
        f"cfg = DataConfig(seq_length=64, vocab_size={VOCAB}, cache_dir={str(tmp_path)!r})\n"
        "train, valid, tok = build_embedded_datasets(cfg)\n"
        "print(int(train.tokens.astype('int64').sum()), int(valid.tokens.astype('int64').sum()))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    expected = [str(int(ds.tokens.astype(np.int64).sum())) for ds in (train, valid)]
    assert outputs == [expected, expected]
    # Builders remove their own staging dirs; the dead process's one is inert.
    assert set(entry_dirs(tmp_path)) == {key, stale.name}
