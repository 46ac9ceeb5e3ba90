"""The named launch configs are flag sets the trainer accepts for the world they are meant for."""

from __future__ import annotations

import subprocess

import pytest

from megatron_lgs.arguments import parse_args
from tests.conftest import REPO


def _config_args(name: str) -> list[str]:
    script = f'source launch/configs/{name}.sh && printf "%s\\n" "${{CONFIG_ARGS[@]}}"'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()


@pytest.mark.parametrize("name, world_size, dp", [("tiny-cpu", 1, 1), ("gpt-1b", 1, 1),
                                                  ("gpt-10b", 16, 2), ("gpt-100b-moe", 128, 8)])
def test_config_parses_for_its_world(name, world_size, dp):
    cfg = parse_args(_config_args(name), world_size=world_size)
    assert cfg.parallel.data_parallel_size == dp
