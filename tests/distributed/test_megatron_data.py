"""pretrain_gpt.py --data-path W1 PREFIX1 W2 PREFIX2 over Megatron datasets that megatron-core's
own IndexedDatasetBuilder wrote (no manifest of ours beside them: --tokenizer-model): the
blend reads them token for token, and a run stopped and resumed equals the straight run
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipeline.executors.local import LocalExecutor
from data_pipeline.loader import LoaderConfig, blend_datasets
from data_pipeline.shard_reader import DocumentStore
from tests.conftest import TINY_GPT, run_pretrain
from tests.unit.data_pipeline.corpus_helpers import prepare_corpus, write_corpus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    root = tmp_path_factory.mktemp("megatron")
    corpus = write_corpus(root / "src")
    prepared = prepare_corpus(corpus, root / "ds", executor=LocalExecutor(0))
    store = DocumentStore([prepared.output])
    out = root / "foreign"
    out.mkdir()
    names = []
    for domain in ("web", "code"):
        builder = IndexedDatasetBuilder(str(out / f"{domain}.bin"),
                                        dtype=DType.optimal_dtype(store.vocab_size))
        docs = np.flatnonzero(store.domain == store.domain_names.index(domain))
        for doc in docs.tolist():
            tokens = store.read(doc)
            builder.add_document(tokens, [len(tokens)])
        builder.finalize(str(out / f"{domain}.idx"))
        names.append(str(out / domain))
    return store, names, str(prepared.output / "tokenizer.json")


def test_prefixes_read_token_for_token(prefixes):
    store, names, tokenizer = prefixes
    foreign = DocumentStore(names, tokenizer=tokenizer)
    ours = np.concatenate([np.flatnonzero(store.domain == store.domain_names.index(d))
                           for d in ("web", "code")])
    assert len(foreign) == len(ours) and foreign.eod_id == store.eod_id
    for k, doc in enumerate(ours.tolist()):
        assert np.array_equal(foreign.read(k), store.read(doc))
    with pytest.raises(Exception, match="--tokenizer-model"):
        DocumentStore(names)
    blend = blend_datasets(["0.7", names[0], "0.3", names[1]],
                           LoaderConfig(64, tokenizer_model=tokenizer))
    assert blend.names == names and len(blend) > 0


def test_pretrain_on_megatron_prefixes_resumes_bitwise(prefixes, tmp_path):
    _, names, tokenizer = prefixes
    args = [*TINY_GPT, "--data-path", "0.7", names[0], "0.3", names[1], "--tokenizer-model",
            tokenizer, "--train-iters", "8", "--log-interval", "1"]
    straight = run_pretrain(args, save_dir=tmp_path / "straight").losses()
    assert len(straight) == 8
    stopped = tmp_path / "stopped"
    run_pretrain([*args, "--exit-interval", "4"], save_dir=stopped)
    resumed = run_pretrain([*args, "--load", str(stopped)], save_dir=stopped)
    assert "at iteration 4" in resumed.stdout
    assert resumed.losses() == straight  # bitwise: floats compared with ==
