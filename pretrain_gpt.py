"""Pretrain a GPT with megatron-core, in the shape of Megatron-LM's pretrain_gpt.py.

    python pretrain_gpt.py                       # tiny GPT on the embedded corpus, this machine
    torchrun --nproc-per-node 2 pretrain_gpt.py --use-distributed-optimizer

A new model type is a new entry file with its own model_provider / forward_step /
datasets_provider, not a fork of the trainer.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist

from megatron_lgs import context_parallel
from megatron_lgs.arguments import parse_args
from megatron_lgs.model import build_model
from megatron_lgs.platform import Platform, get_platform
from megatron_lgs.run_config import Config, ConfigError
from megatron_lgs.training import Datasets, pretrain


def model_provider(cfg: Config, platform: Platform, vocab_size: int,
                   vp_stage: int | None = None) -> torch.nn.Module:
    """This rank's model chunk (`vp_stage`: its virtual pipeline stage, interleaved schedule)."""
    return build_model(cfg, platform, vocab_size, vp_stage)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple:
    """Sum of masked token losses and the token count; the schedule divides, so micro-batches
    and data-parallel ranks weigh every token equally."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss.detach().clone(), mask.sum().detach()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model: torch.nn.Module, return_schedule_plan: bool = False
                 ) -> tuple:
    # The loader collates on the host; the model's device is the platform's.
    device = get_platform().device
    batch = {k: v.to(device, non_blocking=True) for k, v in next(data_iterator).items()}
    batch = context_parallel.batch_on_this_rank(batch)
    # The combined 1F1B schedule (--overlap-moe-expert-parallel-comm) asks for the model's
    # schedule plan: the same forward in pieces it interleaves with another micro-batch's.
    run = model.build_schedule_plan if return_schedule_plan else model
    output = run(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


# Default blend of the embedded corpus's domains (stdlib code, pydoc prose).
EMBEDDED_WEIGHTS = {"code": 0.7, "prose": 0.3}


def datasets_provider(cfg: Config) -> Datasets:
    """Prepared datasets (--data-path), or the embedded corpus run through the same `prepare`
    pipeline on first use (rank 0 prepares, the others wait). Train and validation are
    disjoint sets of documents of every domain."""
    from data_pipeline import DatasetError
    from data_pipeline.embedded import prepare_embedded
    from data_pipeline.loader import LoaderConfig, blend_datasets, blend_domains
    from data_pipeline.shard_reader import DocumentStore

    d = cfg.data
    loader = LoaderConfig(seq_length=cfg.model.seq_length, seed=cfg.training.seed,
                          eod_mask_loss=d.eod_mask_loss, tokenizer_model=d.tokenizer_model)
    try:
        try:
            if dist.get_rank() == 0 and not d.data_path:
                prepare_embedded(d.data_cache_dir, d.vocab_size)
        finally:  # the others must not wait forever for a rank 0 that failed
            dist.barrier()
        if d.data_path and not d.domain_weights and d.data_mix == "static":
            train, valid = (blend_datasets(d.data_path, replace(loader, split=split))
                            for split in ("train", "valid"))
            valid_by_domain = {}
        else:  # blend by domain, the form dynamic mixing adjusts
            dirs = list(d.data_path) or [str(prepare_embedded(d.data_cache_dir, d.vocab_size))]
            every = DocumentStore(dirs, tokenizer=d.tokenizer_model).domain_names \
                if d.data_path else []
            weights = dict(d.domain_weights) or (EMBEDDED_WEIGHTS if not d.data_path
                                                  else dict.fromkeys(every, 1.0))
            train, valid = (blend_domains(dirs, weights, replace(loader, split=split))
                            for split in ("train", "valid"))
            valid_by_domain = {
                name: blend_domains(dirs, {name: 1.0}, replace(loader, split="valid"))
                for name in train.names} if d.data_mix == "dynamic" else {}
    except (ValueError, DatasetError) as exc:
        raise ConfigError(f"data: {exc}") from None
    return Datasets(train=train, valid=valid, vocab_size=train.store.vocab_size,
                    fingerprint=f"{train.fingerprint}/{valid.fingerprint}",
                    legacy_fingerprint=f"{train.legacy_fingerprint}/{valid.legacy_fingerprint}",
                    schedule=train.schedule, valid_by_domain=valid_by_domain,
                    tokenizer_file=str(train.store.tokenizer_file))


if __name__ == "__main__":
    pretrain(parse_args(), model_provider, forward_step, datasets_provider)
