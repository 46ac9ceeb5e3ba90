"""Offline data pipeline: ``python -m data_pipeline prepare`` (normalization, filters, exact and
MinHash dedup, byte-level BPE, WebDataset shards with an index), a blended, packed, map-style
loader over prepared datasets, loss-driven domain weights, and the embedded CPython corpus that
the trainer prepares when no data is given."""

from data_pipeline.batching import collate, global_batch_indices
from data_pipeline.embedded import (
    Document,
    EmbeddedCorpus,
    corpus_fingerprint,
    embedded_corpus,
    load_embedded_corpus,
    prepare_embedded,
)
from data_pipeline.loader import BlendedDataset, LoaderConfig, blend_datasets, blend_domains
from data_pipeline.manifest import DatasetError
from data_pipeline.mixing import MixingConfig, MixingSchedule, update_weights
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer

__all__ = [
    "BlendedDataset",
    "DatasetError",
    "Document",
    "EmbeddedCorpus",
    "LoaderConfig",
    "MixingConfig",
    "MixingSchedule",
    "blend_datasets",
    "blend_domains",
    "collate",
    "corpus_fingerprint",
    "embedded_corpus",
    "eod_id",
    "global_batch_indices",
    "load_embedded_corpus",
    "prepare_embedded",
    "load_tokenizer",
    "train_bpe_tokenizer",
    "update_weights",
]
