"""A transformers model directory -> a weights-only megatron-lgs checkpoint (iteration 0) that a
run of any layout starts from with `--load CHECKPOINT --finetune` and the model flags printed.

Every input is checked before CHECKPOINT is created: the architecture and its options (those
with no faithful megatron equivalent are refused), each safetensors file's header and length,
the tokenizer. Weights are imported in fp32; the vocabulary is padded as the trainer pads it at
TP = 1 (the padded rows are zeros).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from megatron_lgs import model_record
from megatron_lgs.convert import checkpoint_io, hf_mapping
from megatron_lgs.convert.errors import ConvertError
from megatron_lgs.convert.export import check_target, run_tokenizer
from megatron_lgs.model_record import ModelRecord
from megatron_lgs.run_config import ModelConfig


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def read_config(hf_dir: Path):
    if not (hf_dir / "config.json").is_file():
        raise ConvertError(f"{hf_dir}: no config.json (not a transformers model directory)")
    try:
        return AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (ValueError, OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{hf_dir / 'config.json'}: {_first_line(exc)}") from None


def check_weights(hf_dir: Path) -> None:
    """Open every safetensors file: a bad header or a file shorter than its header says is one
    line here, not a traceback from deep inside from_pretrained."""
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{hf_dir}: no *.safetensors weights")
    for path in files:
        try:
            with safe_open(str(path), "pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ConvertError(f"{path}: unreadable safetensors file ({_first_line(exc)})") \
                from None


def model_flags(m: ModelConfig) -> list[str]:
    """pretrain_gpt.py flags that build this model (those that differ from the defaults)."""
    defaults, flags = ModelConfig(), []
    negated = {"add_bias_linear": "--disable-bias-linear"}
    for f in fields(ModelConfig):
        value = getattr(m, f.name)
        if value == getattr(defaults, f.name) or value is None:
            continue
        if isinstance(value, bool):
            flags.append(negated.get(f.name, "--" + f.name.replace("_", "-")))
        else:
            flags += ["--" + f.name.replace("_", "-"), str(value)]
    return flags


def from_hf(hf_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> Path:
    hf_dir, out = Path(hf_dir), Path(checkpoint)
    check_target(out)
    if not hf_dir.is_dir():
        raise ConvertError(f"{hf_dir}: no such directory")
    config = read_config(hf_dir)
    m = hf_mapping.model_config_from_hf(config)
    check_weights(hf_dir)
    tokenizer_file = hf_dir / model_record.TOKENIZER_FILE
    run_tokenizer(hf_dir)
    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report of missing keys: said below, in one line
    try:
        hf_model, info = AutoModelForCausalLM.from_pretrained(
            hf_dir, local_files_only=True, dtype=torch.float32, output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConvertError(f"{hf_dir}: transformers cannot load it ({_first_line(exc)})") \
            from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers fills weights its config names but the files lack with fresh random ones,
    # and drops weights the config does not name, both with only a log line.
    for kind, what in (("missing_keys", "the config names but the weights lack"),
                       ("unexpected_keys", "the weights hold but the config does not name")):
        if info[kind]:
            names = sorted(info[kind])
            raise ConvertError(f"{hf_dir}: {len(names)} tensors {what} (config.json and the "
                               f"weights disagree): {', '.join(names[:3])}"
                               + (", ..." if len(names) > 3 else ""))
    record = ModelRecord(model=m, vocab_size=config.vocab_size, precision="fp32",
                         tensor_model_parallel_size=1)
    with checkpoint_io.into_place(out) as partial, checkpoint_io.single_process():
        model = checkpoint_io.build_full_model(record)
        state = hf_mapping.from_hf(hf_model.state_dict(), m, config.vocab_size,
                                   checkpoint_io.padded_vocab(record))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:  # a mapping bug, never a user error
            raise RuntimeError(f"mapping mismatch: missing {missing}, unexpected "
                               f"{unexpected}")
        partial.mkdir(parents=True)
        checkpoint_io.save_weights_checkpoint(model, record, tokenizer_file, partial)
    return out
