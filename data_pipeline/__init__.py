"""Offline data pipeline: embedded CPython corpus, byte-level BPE, packed GPT samples."""

from data_pipeline.dataset import (
    DataConfig,
    PackedDataset,
    build_embedded_datasets,
    collate,
    global_batch_indices,
)
from data_pipeline.embedded import (
    Document,
    EmbeddedCorpus,
    corpus_fingerprint,
    embedded_corpus,
    load_embedded_corpus,
)
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer

__all__ = [
    "DataConfig",
    "Document",
    "EmbeddedCorpus",
    "PackedDataset",
    "build_embedded_datasets",
    "collate",
    "corpus_fingerprint",
    "embedded_corpus",
    "eod_id",
    "global_batch_indices",
    "load_embedded_corpus",
    "load_tokenizer",
    "train_bpe_tokenizer",
]
