"""Byte-level BPE (GPT-2 style) trained locally with HuggingFace ``tokenizers``."""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOD_TOKEN = "<|endoftext|>"
# 256 byte symbols plus the end-of-document token; anything smaller cannot
# represent arbitrary text.
MIN_VOCAB_SIZE = 257


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB_SIZE}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False keeps decode(encode(x)) == x exactly.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        # Seeding every byte means unseen characters still encode (no UNK).
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:  # the Rust library raises a bare Exception for any bad file
        raise ValueError(f"not a tokenizer.json ({exc})") from None


def eod_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(EOD_TOKEN)
    if token_id is None:
        raise ValueError(f"tokenizer has no {EOD_TOKEN!r} token")
    return token_id
