"""pretrain_gpt.py saving as it did until 2026-12-07: a plain (non-distributed) optimizer's state
in megatron-core's own format, and a layout record without `optimizer_format_version`. Tests
resume such checkpoints with today's trainer."""

from __future__ import annotations

import runpy

from megatron_lgs import checkpointing

_sharded_state_dict = checkpointing._sharded_state_dict
_layout = checkpointing.layout


def _legacy_sharded_state_dict(model, optimizer, is_loading, legacy_plain=False):
    return _sharded_state_dict(model, optimizer, is_loading, legacy_plain=not is_loading)


def _legacy_layout(model):
    record = _layout(model)
    del record["optimizer_format_version"]
    return record


if __name__ == "__main__":
    checkpointing._sharded_state_dict = _legacy_sharded_state_dict
    checkpointing.layout = _legacy_layout
    runpy.run_module("pretrain_gpt", run_name="__main__", alter_sys=True)
