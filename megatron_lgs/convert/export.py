"""CHECKPOINT (any layout) -> a transformers model directory: config.json, safetensors weights,
tokenizer.json + tokenizer_config.json, loadable offline with AutoModelForCausalLM /
AutoTokenizer. Everything is checked before OUT is created; the directory is written beside OUT
and renamed into place, so a failure leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from data_pipeline.tokenizer import EOD_TOKEN
from megatron_lgs import model_record
from megatron_lgs.convert import checkpoint_io, hf_mapping
from megatron_lgs.convert.errors import ConvertError
from megatron_lgs.value_checks import unwritable_parent

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def check_target(out: Path) -> None:
    """`out` must be absent or an empty folder, in a folder this process can write (its
    OUT.partial sibling is written first), before any weights are read."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(f"{out} exists and is not an empty directory; refusing to overwrite")
    problem = unwritable_parent(out)
    if problem:
        raise ConvertError(f"{out}: {problem}")


def run_tokenizer(directory: Path) -> Tokenizer:
    path = directory / model_record.TOKENIZER_FILE
    if not path.is_file():
        raise ConvertError(f"{directory} has no {model_record.TOKENIZER_FILE} (a tokenizers "
                           f"file); the model cannot be converted without its tokenizer")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        raise ConvertError(f"{path}: not a tokenizers file ({exc})") from None


def to_hf(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    out = Path(out)
    check_target(out)
    directory = checkpoint_io.resolve(checkpoint)
    record = checkpoint_io.read_record(directory)
    hf_mapping.family(record.model)  # refuse an unmappable model before reading any weight
    tokenizer = run_tokenizer(directory)
    config = hf_mapping.hf_config(record.model, record.vocab_size,
                                  tokenizer.token_to_id(EOD_TOKEN), DTYPES[record.precision])
    with checkpoint_io.single_process():
        model = checkpoint_io.load_full_model(directory, record)
        state = hf_mapping.to_hf(checkpoint_io.full_state_dict(model), record.model,
                                 record.vocab_size)
    with checkpoint_io.into_place(out) as partial:
        write_hf(config, state, tokenizer, partial)
    return out


def write_hf(config, state: dict[str, torch.Tensor], tokenizer: Tokenizer, out: Path) -> None:
    """transformers writes its own format (file names, legacy expert layouts) from the model."""
    hf_logging.disable_progress_bar()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k in expected}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:  # a mapping bug, never a user error
        raise RuntimeError(f"mapping mismatch: missing {sorted(missing)}, "
                           f"unexpected {sorted(unexpected)}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.save_pretrained(out)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOD_TOKEN, bos_token=EOD_TOKEN,
        model_max_length=config.max_position_embeddings
        if hasattr(config, "max_position_embeddings") else config.n_positions,
    ).save_pretrained(out)
