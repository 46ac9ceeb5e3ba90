"""The named launch configs are flag sets the trainer accepts for the world they are meant for."""

from __future__ import annotations

import re

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.launch_configs import (
    CONFIGS_DIR,
    WORLD_SIZES,
    config_args,
    config_names,
    load_config,
)


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


@pytest.mark.parametrize("text,said", [
    ("garbage\n", r"could not source it \(exit 127\): .*garbage: command not found"),
    ("", "defines no CONFIG_ARGS array"),
    ("CONFIG_ARGS='--num-layers 2'\n", "defines no CONFIG_ARGS array"),  # a string
])
def test_a_config_bash_cannot_read_is_a_one_line_error(tmp_path, text, said):
    (tmp_path / "bad.sh").write_text(text)
    with pytest.raises(ValueError, match=said) as e:
        config_args("bad", tmp_path)
    assert "\n" not in str(e.value)


def test_config_elements_keep_spaces_and_an_empty_array_is_empty(tmp_path):
    (tmp_path / "odd.sh").write_text("CONFIG_ARGS=(--name 'two words' '')\n")
    assert config_args("odd", tmp_path) == ["--name", "two words", ""]
    (tmp_path / "none.sh").write_text("CONFIG_ARGS=()\n")
    assert config_args("none", tmp_path) == []


def _parameters(name: str) -> float:
    """Weights of a config's model, counted from its flags (biases and norms left out)."""
    m, vocab = load_config(name).model, load_config(name).data.vocab_size
    h, mats = m.hidden_size, 3 if m.swiglu else 2
    groups = m.num_query_groups if m.group_query_attention else m.num_attention_heads
    attention = 2 * h * h + 2 * h * h * groups // m.num_attention_heads
    if m.num_experts:
        mlp = m.num_experts * mats * h * (m.moe_ffn_hidden_size or m.ffn_size) + h * m.num_experts
    else:
        mlp = mats * h * m.ffn_size
    embeddings = vocab * h * (2 if m.untie_embeddings_and_output_weights else 1)
    return m.num_layers * (attention + mlp) + embeddings


@pytest.mark.parametrize("name", config_names())
def test_config_is_the_size_its_header_says(name):
    """A config's '~N B' header is its size within 25% (gpt-100b-moe was once 541B)."""
    header = (CONFIGS_DIR / f"{name}.sh").read_text().splitlines()[0]
    said = re.search(r"~([0-9.]+)B", header)
    if said is None:
        assert name == "tiny-cpu", header  # the only config without a size in its name
        return
    assert abs(_parameters(name) / (float(said.group(1)) * 1e9) - 1) < 0.25, header
