"""Pretrain a GPT with megatron-core, in the shape of Megatron-LM's pretrain_gpt.py.

    python pretrain_gpt.py                       # tiny GPT on the embedded corpus, this machine
    torchrun --nproc-per-node 2 pretrain_gpt.py --use-distributed-optimizer

A new model type is a new entry file with its own model_provider / forward_step /
datasets_provider, not a fork of the trainer.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from megatron_lgs.arguments import Config, ConfigError, parse_args
from megatron_lgs.model import build_model
from megatron_lgs.platform import Platform
from megatron_lgs.training import Datasets, pretrain


def model_provider(cfg: Config, platform: Platform, vocab_size: int) -> torch.nn.Module:
    return build_model(cfg, platform, vocab_size)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple:
    """Sum of masked token losses and the token count; the schedule divides, so micro-batches
    and data-parallel ranks weigh every token equally."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss.detach().clone(), mask.sum().detach()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model: torch.nn.Module) -> tuple:
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def datasets_provider(cfg: Config) -> Datasets:
    """The embedded corpus (standard-library code + pydoc prose), tokenized with a BPE trained
    on it. Rank 0 builds the cache; the others read it."""
    from data_pipeline import DataConfig, build_embedded_datasets

    data_cfg = DataConfig(seq_length=cfg.model.seq_length, seed=cfg.training.seed,
                          vocab_size=cfg.data.vocab_size, cache_dir=cfg.data.data_cache_dir)
    try:
        try:
            if dist.get_rank() == 0:
                build_embedded_datasets(data_cfg)
        finally:  # the others must not wait forever for a rank 0 that failed
            dist.barrier()
        train, valid, tokenizer = build_embedded_datasets(data_cfg)
    except ValueError as exc:  # e.g. a sequence longer than the validation split
        raise ConfigError(f"embedded data: {exc}") from None
    return Datasets(train=train, valid=valid, vocab_size=tokenizer.get_vocab_size(),
                    fingerprint=f"{train.fingerprint}/{valid.fingerprint}")


if __name__ == "__main__":
    pretrain(parse_args(), model_provider, forward_step, datasets_provider)
