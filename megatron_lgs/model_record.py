"""What a checkpoint says about its model, so that tools other than the trainer can rebuild it:
`model.json` (the model flags, the tokenizer's true vocabulary size, the precision) and the run's
`tokenizer.json`, both written into every checkpoint directory before it is committed.

The trainer alone never needs them (a resume takes its flags from the command line); export to
Hugging Face and generation (`megatron_lgs.convert`, `megatron_lgs.generate`) do.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from megatron_lgs.run_config import Config, ConfigError, ModelConfig

MODEL_FILE = "model.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = 1


@dataclass(frozen=True)
class ModelRecord:
    model: ModelConfig
    vocab_size: int  # the tokenizer's; the embedding is padded beyond it (see model.py)
    precision: str  # fp32 | bf16 | fp16: the dtype of the saved model weights
    tensor_model_parallel_size: int  # the padding of the vocabulary depends on it

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelRecord:
        raw = json.loads(text)
        if raw.pop("format", None) != FORMAT:
            raise ValueError(f"{MODEL_FILE} is not format {FORMAT}")
        known = {f.name for f in fields(ModelConfig)}
        model = ModelConfig(**{k: v for k, v in raw.pop("model").items() if k in known})
        return cls(model=model, **raw)


def record_of(cfg: Config, vocab_size: int) -> ModelRecord:
    return ModelRecord(model=cfg.model, vocab_size=vocab_size, precision=cfg.precision.name,
                       tensor_model_parallel_size=cfg.parallel.tensor_model_parallel_size)


def write(directory: Path, record: ModelRecord, tokenizer_file: str | None) -> None:
    """Called by rank 0 on the checkpoint directory before it is renamed into place."""
    (directory / MODEL_FILE).write_text(record.to_json())
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, directory / TOKENIZER_FILE)


def read(directory: Path) -> ModelRecord:
    return ModelRecord.from_json((directory / MODEL_FILE).read_text())


def check_finetune_vocabulary(directory: Path, tokenizer_file: str | None,
                              vocab_size: int) -> None:
    """--finetune loads the word embeddings and the output layer row by row, and megatron-core
    loads them from a vocabulary of another size without a word (it allows the padding to
    differ): refuse a checkpoint whose rows belong to other tokens than this run's data."""
    saved = directory / TOKENIZER_FILE
    if tokenizer_file is not None and saved.is_file():
        from data_pipeline.tokenizer import load_tokenizer

        try:
            same = load_tokenizer(saved).get_vocab() == load_tokenizer(tokenizer_file).get_vocab()
        except ValueError as exc:
            raise ConfigError(f"--finetune from {directory}: {exc}") from None
        if not same:
            raise ConfigError(
                f"--finetune from {directory}: its tokenizer is not the one this run's data was "
                f"tokenized with ({tokenizer_file}), so its embedding rows belong to other "
                f"tokens; prepare the data with --tokenizer {saved}")
    elif (directory / MODEL_FILE).is_file():
        saved_size = read(directory).vocab_size
        if saved_size != vocab_size:
            raise ConfigError(f"--finetune from {directory}: its vocabulary has {saved_size} "
                              f"tokens, this run's data {vocab_size}")
