"""The named launch configs are flag sets the trainer accepts for the world they are meant for."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.launch_configs import WORLD_SIZES, config_args, config_names, load_config


@pytest.mark.parametrize("name, world_size, dp", [("tiny-cpu", 1, 1), ("gpt-1b", 1, 1),
                                                  ("gpt-10b", 16, 2), ("gpt-100b-moe", 128, 8)])
def test_config_parses_for_its_world(name, world_size, dp):
    cfg = parse_args(config_args(name), world_size=world_size)
    assert cfg.parallel.data_parallel_size == dp


@pytest.mark.parametrize("name", config_names())
def test_every_config_has_a_world_size(name):
    assert WORLD_SIZES[name] >= 1
    assert "--num-layers" in config_args(name)


def test_unknown_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no launch config 'nope'"):
        config_args("nope")
    (tmp_path / "new.sh").write_text("CONFIG_ARGS=(\n  --num-layers 2  # a comment\n)\n")
    assert config_args("new", tmp_path) == ["--num-layers", "2"]
    with pytest.raises(ValueError, match="no world size"):
        load_config("new", tmp_path)
