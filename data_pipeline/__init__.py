"""Offline data pipeline: embedded CPython corpus, byte-level BPE, packed GPT samples; and
``python -m data_pipeline prepare`` (deduplicated WebDataset shards) with a blended, packed,
map-style loader over them and loss-driven domain weights."""

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
from data_pipeline.loader import BlendedDataset, LoaderConfig, blend_datasets, blend_domains
from data_pipeline.manifest import DatasetError
from data_pipeline.mixing import MixingConfig, MixingSchedule, update_weights
from data_pipeline.tokenizer import eod_id, load_tokenizer, train_bpe_tokenizer

__all__ = [
    "BlendedDataset",
    "DataConfig",
    "DatasetError",
    "Document",
    "EmbeddedCorpus",
    "LoaderConfig",
    "MixingConfig",
    "MixingSchedule",
    "PackedDataset",
    "blend_datasets",
    "blend_domains",
    "build_embedded_datasets",
    "collate",
    "corpus_fingerprint",
    "embedded_corpus",
    "eod_id",
    "global_batch_indices",
    "load_embedded_corpus",
    "load_tokenizer",
    "train_bpe_tokenizer",
    "update_weights",
]
