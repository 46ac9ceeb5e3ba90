"""Megatron-LM's vocabulary padding, shared by the trainer, the checkpoint converters and the
step model (a module of its own: `run_config` imports the `lgs` package, which needs this)."""


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary so each tensor-parallel shard has a round size."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
