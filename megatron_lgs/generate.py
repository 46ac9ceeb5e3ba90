"""python -m megatron_lgs.generate CHECKPOINT --prompt TEXT --max-new-tokens N
        [--temperature T [--top-k K] [--top-p P] [--seed S]] [--no-kv-cache]

Text from a checkpoint of any layout, on CPU, in one process: the model is loaded whole
(convert.checkpoint_io), the prompt goes through the run's own tokenizer (saved in the
checkpoint), and decoding uses megatron-core's static KV cache (`StaticInferenceContext`: the
prompt in one forward, then one token per forward). Greedy unless --temperature is given. Only
the vocabulary the tokenizer knows is sampled (the padded rows of the output layer never are);
generation stops at the end-of-document token. stdout gets the prompt followed by the generated
text, decoded together, and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from dataclasses import dataclass

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from megatron.core.inference.contexts import StaticInferenceContext  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import megatron_lgs  # noqa: E402,F401  (prepares megatron-core before it is imported)
from data_pipeline.tokenizer import EOD_TOKEN  # noqa: E402
from megatron_lgs.convert import checkpoint_io  # noqa: E402
from megatron_lgs.convert.errors import ConvertError  # noqa: E402
from megatron_lgs.convert.export import run_tokenizer  # noqa: E402


@dataclass(frozen=True)
class Sampling:
    temperature: float | None = None  # None: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int = 0


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """Greedy, or a draw from softmax(logits / T) restricted to the top k, then to the smallest
    set whose probability reaches top_p (the order transformers applies them in)."""
    if sampling.temperature is None:
        return int(logits.argmax())
    logits = logits.double() / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        order = torch.argsort(logits, descending=True)
        cumulative = torch.softmax(logits[order], dim=0).cumsum(0)
        drop = cumulative - torch.softmax(logits[order], dim=0) >= sampling.top_p  # keep >= 1
        logits[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=generator))


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, vocab_size: int,
             stop_id: int | None, sampling: Sampling = Sampling(),
             kv_cache: bool = True) -> list[int]:
    """The generated token ids (not the prompt). Without the KV cache every step runs the whole
    sequence again: the reference the cache is checked against."""
    ids = list(prompt)
    generator = torch.Generator().manual_seed(sampling.seed)
    context = StaticInferenceContext(1, len(prompt) + max_new_tokens) if kv_cache else None
    for _ in range(max_new_tokens):
        if context is None or context.sequence_len_offset == 0:
            tokens, start = ids, 0
        else:
            context.enable_decode_mode()
            tokens, start = ids[-1:], len(ids) - 1
        positions = torch.arange(start, start + len(tokens)).unsqueeze(0)
        logits = model(torch.tensor([tokens]), positions, None, inference_context=context,
                       runtime_gather_output=True)
        if context is not None:
            context.sequence_len_offset += len(tokens)
        token = next_token(logits[0, -1, :vocab_size], sampling, generator)
        ids.append(token)
        if token == stop_id:
            break
    return ids[len(prompt):]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron_lgs.generate",
                                description="Generate text from a checkpoint (any layout).")
    p.add_argument("checkpoint", help="a --save directory or one of its iter_N directories")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, help="sample at this temperature (default: "
                   "greedy)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--no-kv-cache", dest="kv_cache", action="store_false",
                   help="recompute the whole sequence at every step (a reference for the cache)")
    return p


def _check(args: argparse.Namespace) -> Sampling:
    if args.max_new_tokens < 1:
        raise ConvertError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.temperature is None and (args.top_k or args.top_p != 1.0):
        raise ConvertError("--top-k and --top-p shape sampling: give --temperature too "
                           "(without it decoding is greedy)")
    if args.temperature is not None and not 0 < args.temperature < math.inf:
        raise ConvertError(f"--temperature must be finite and > 0, got {args.temperature}")
    if args.top_k < 0 or not 0.0 < args.top_p <= 1.0:
        raise ConvertError("--top-k must be >= 0 and --top-p in (0, 1]")
    return Sampling(args.temperature, args.top_k, args.top_p, args.seed)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        sampling = _check(args)
        directory = checkpoint_io.resolve(args.checkpoint)
        record = checkpoint_io.read_record(directory)
        tokenizer: Tokenizer = run_tokenizer(directory)
        prompt = tokenizer.encode(args.prompt).ids
        limit = record.model.max_position_embeddings or record.model.seq_length
        if not prompt:
            raise ConvertError("--prompt is empty: there is nothing to continue")
        if len(prompt) + args.max_new_tokens > limit:
            raise ConvertError(f"the prompt ({len(prompt)} tokens) plus --max-new-tokens "
                               f"({args.max_new_tokens}) exceeds the model's {limit} positions")
        # Only the text goes to stdout; whatever megatron prints while loading goes to stderr.
        with contextlib.redirect_stdout(sys.stderr), checkpoint_io.single_process():
            model = checkpoint_io.load_full_model(directory, record)
            new = generate(model, prompt, args.max_new_tokens, record.vocab_size,
                           tokenizer.token_to_id(EOD_TOKEN), sampling, args.kv_cache)
    except ConvertError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    sys.stdout.write(tokenizer.decode(prompt + new) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
