import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_helpers import prepare_corpus, write_corpus

from data_pipeline import collate
from data_pipeline.loader import (
    LoaderConfig,
    blend_datasets,
    blend_domains,
    parse_data_path,
)
from data_pipeline.manifest import DatasetError

REPO = Path(__file__).resolve().parents[3]
SEQ = 32
WEIGHTS = {"web": 0.6, "code": 0.25, "books": 0.15}


def dataset(prepared, seed=1234, weights=WEIGHTS, **kwargs):
    return blend_domains([prepared.output], weights, LoaderConfig(SEQ, seed, **kwargs))


def window(sample):
    return torch.cat([sample["tokens"], sample["labels"][-1:]])


def test_sample_format(prepared):
    ds = dataset(prepared)
    eod = ds.store.eod_id
    for i in (0, 1, 17, len(ds) - 1, 10 * len(ds)):
        s = ds[i]
        assert set(s) == {"tokens", "labels", "loss_mask", "position_ids"}
        assert s["tokens"].dtype == s["labels"].dtype == torch.int64
        assert s["loss_mask"].dtype == torch.float32
        assert all(v.shape == (SEQ,) for v in s.values())
        assert torch.equal(s["labels"][:-1], s["tokens"][1:])
        assert torch.equal(s["position_ids"], torch.arange(SEQ))
        assert torch.equal(s["loss_mask"] == 0, s["tokens"] == eod)
    assert dataset(prepared, eod_mask_loss=False)[0]["loss_mask"].min() == 1.0
    assert ds.names == ["web", "code", "books"]


def check_epoch_tiles_stream(ds, comp, epoch):
    """Epoch ``epoch`` of a component: its windows are the consecutive (seq+1)-token windows,
    overlapping by one, of its documents in that epoch's order, each followed by one EOD."""
    eod = ds.store.eod_id
    n = comp.windows_per_epoch
    windows = [comp.window(epoch * n + j) for j in range(n)]
    comp._shuffle(epoch)
    stream = np.concatenate([np.append(ds.store.read(int(comp.docs[k])), eod)
                             for k in comp._order])
    assert sorted(int(w) * SEQ for w in comp._windows) == list(range(0, n * SEQ, SEQ))
    for j, w in enumerate(windows):
        start = int(comp._windows[j]) * SEQ
        assert np.array_equal(w, stream[start:start + SEQ + 1]), (comp.name, epoch, j)
    assert (stream == eod).sum() == len(comp.docs)
    assert len(stream) - (n * SEQ + 1) < SEQ  # only an incomplete last window is dropped
    return comp._order.copy()


def test_windows_tile_each_components_packed_stream(prepared):
    ds = dataset(prepared)
    for comp in ds.components:
        assert set(ds.store.domain[comp.docs].tolist()) == {
            ds.store.domain_names.index(comp.name)}
        orders = [check_epoch_tiles_stream(ds, comp, epoch) for epoch in (0, 1, 5)]
        assert not np.array_equal(orders[0], orders[1])  # documents reshuffled every epoch
        assert sorted(orders[0]) == sorted(orders[1]) == list(range(len(comp.docs)))


def test_sample_is_a_pure_function_of_the_index(prepared):
    indices = [0, 5, 999, 3, 10**6, 7, 0, 4321]
    a = dataset(prepared)
    b = dataset(prepared)
    first = {i: window(a[i]) for i in indices}
    for i in reversed(indices):
        assert torch.equal(window(b[i]), first[i])
    batch = b.__getitems__(indices)
    assert all(torch.equal(window(s), first[i]) for s, i in zip(batch, indices, strict=True))


def test_seed_selects_the_sequence(prepared):
    def tokens(ds):
        return torch.stack([window(s) for s in ds.__getitems__(list(range(300)))])

    base = tokens(dataset(prepared, seed=7))
    assert torch.equal(tokens(dataset(prepared, seed=7)), base)
    assert not torch.equal(tokens(dataset(prepared, seed=8)), base)


def test_blend_hits_the_weights(prepared):
    ds = dataset(prepared)
    components, _ = ds.locate(np.arange(100_000))
    counts = np.stack([np.cumsum(components == c) for c in range(3)], axis=1)
    target = np.arange(1, 100_001)[:, None] * np.array([0.6, 0.25, 0.15])
    assert np.abs(counts - target).max() < 1.0


def test_global_rng_untouched(prepared):
    ds = dataset(prepared)
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), \
        random.getstate()
    ds.__getitems__([0, 10**5, 3 * 10**6])
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert random.getstate() == py_state


def test_fingerprint(prepared, tmp_path):
    base = dataset(prepared).fingerprint
    assert dataset(prepared).fingerprint == base
    assert dataset(prepared, seed=1).fingerprint != base
    assert dataset(prepared, weights={"web": 0.5, "code": 0.5}).fingerprint != base
    assert blend_domains([prepared.output], WEIGHTS, LoaderConfig(SEQ + 1)).fingerprint != base
    assert dataset(prepared, eod_mask_loss=False).fingerprint != base


def test_the_same_documents_prepared_from_another_folder_are_the_same_data(tmp_path):
    """The embedded corpus goes through a fresh temporary folder each time it is built, so two
    builds' manifests differ in their `sources` only. Until 2026-12-06 that alone changed the
    data fingerprint, and a checkpoint of the default job would not resume once its data cache
    was rebuilt (another node, another working directory, a cleared cache)."""
    from data_pipeline.embedded import prepare_embedded

    first, second = (prepare_embedded(tmp_path / name, 300) for name in ("a", "b"))
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (first, second)]
    assert manifests[0]["sources"] != manifests[1]["sources"]
    assert manifests[0]["fingerprint"] != manifests[1]["fingerprint"]
    weights = {"code": 0.5, "prose": 0.5}
    a, b = (blend_domains([d], weights, LoaderConfig(SEQ)) for d in (first, second))
    assert a.fingerprint == b.fingerprint
    assert a.legacy_fingerprint != b.legacy_fingerprint  # what a checkpoint of then carries
    assert torch.equal(a[7]["tokens"], b[7]["tokens"])


RESUME_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, torch
    from data_pipeline import collate
    from data_pipeline.loader import LoaderConfig, blend_domains
    path, start, stop, workers, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    ds = blend_domains([path], {"web": 0.6, "code": 0.25, "books": 0.15}, LoaderConfig(32))
    batches = [list(range(i, min(i + 4, stop))) for i in range(start, stop, 4)]
    loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=workers,
                                         collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0))
    np.save(out, torch.cat([b["tokens"] for b in loader]).numpy())
    print(ds.fingerprint)
""")


def test_resume_in_a_new_process_with_other_workers(prepared, tmp_path):
    consumed, total = 203, 403
    ds = dataset(prepared)
    uninterrupted = collate(ds.__getitems__(list(range(total))))["tokens"].numpy()
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(prepared.output), str(consumed),
                           str(total), "2", str(tmp_path / "tail.npy")],
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ds.fingerprint  # the resume check the trainer makes
    assert np.array_equal(np.load(tmp_path / "tail.npy"), uninterrupted[consumed:])


def test_data_path_blends_whole_datasets(prepared, tmp_path):
    other = prepare_corpus(write_corpus(tmp_path / "src", seed=2), tmp_path / "other",
                           tokenizer=prepared.output / "tokenizer.json")
    ds = blend_datasets(["0.7", str(prepared.output), "0.3", str(other.output)],
                        LoaderConfig(SEQ))
    assert ds.names == [str(prepared.output), str(other.output)]
    assert [len(c.docs) for c in ds.components] == [240, 240]
    assert np.array_equal(ds.store.dataset[ds.components[1].docs], np.ones(240))
    components, _ = ds.locate(np.arange(1000))
    assert np.bincount(components).tolist() == [700, 300]
    with pytest.raises(ValueError, match="twice"):
        blend_datasets(["1", str(prepared.output), "1", str(prepared.output)], LoaderConfig(SEQ))
    assert blend_datasets([str(prepared.output)], LoaderConfig(SEQ)).names == \
        [str(prepared.output)]
    assert parse_data_path(["0.7", "a", "0.3", "b"]) == [(0.7, "a"), (0.3, "b")]
    for bad in (["0.7", "a", "0.3"], ["x", "a", "1", "b"], []):
        with pytest.raises(ValueError):
            parse_data_path(bad)


def copy_dataset(prepared, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(prepared.output, target)
    return target


def test_missing_or_mismatched_dataset_is_a_clear_error(prepared, tmp_path):
    cfg = LoaderConfig(SEQ)
    with pytest.raises(DatasetError, match="no manifest.json"):
        blend_domains([tmp_path], WEIGHTS, cfg)
    with pytest.raises(DatasetError, match="no domain"):
        blend_domains([prepared.output], {"web": 1.0, "news": 1.0}, cfg)

    broken = copy_dataset(prepared, tmp_path)
    (broken / "shard-000001.idx.npy").unlink()
    with pytest.raises(DatasetError, match="unreadable index"):
        blend_domains([broken], WEIGHTS, cfg)

    shutil.rmtree(broken)
    broken = copy_dataset(prepared, tmp_path)
    tar = broken / "shard-000002.tar"
    tar.write_bytes(tar.read_bytes()[:-5000])
    with pytest.raises(DatasetError, match="truncated or replaced"):
        blend_domains([broken], WEIGHTS, cfg)

    shutil.rmtree(broken)
    broken = copy_dataset(prepared, tmp_path)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["shards"][0]["tokens"] += 1
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="fingerprint does not match"):
        blend_domains([broken], WEIGHTS, cfg)

    shutil.rmtree(broken)
    broken = copy_dataset(prepared, tmp_path)
    tar = broken / "shard-000002.tar"
    data = bytearray(tar.read_bytes())
    data[2000] ^= 0xFF  # same size, different content: only a full check sees it
    tar.write_bytes(bytes(data))
    blend_domains([broken], WEIGHTS, cfg)
    with pytest.raises(DatasetError, match="sha256"):
        blend_domains([broken], WEIGHTS, LoaderConfig(SEQ, verify_shards=True))


def test_datasets_with_different_tokenizers_are_refused(prepared, tmp_path):
    other = prepare_corpus(write_corpus(tmp_path / "src", seed=1), tmp_path / "other",
                           vocab_size=300)
    with pytest.raises(DatasetError, match="different tokenizers"):
        blend_datasets(["1", str(prepared.output), "1", str(other.output)], LoaderConfig(SEQ))


def test_component_too_small_for_one_window(prepared):
    with pytest.raises(DatasetError, match="cannot fill one window"):
        blend_domains([prepared.output], WEIGHTS, LoaderConfig(10**6))


def test_index_validation(prepared):
    ds = dataset(prepared)
    assert torch.equal(ds[np.int64(3)]["tokens"], ds[3]["tokens"])
    with pytest.raises(IndexError):
        ds[-1]
    for bad in (1.0, "3", None, True):
        with pytest.raises(TypeError):
            ds[bad]
