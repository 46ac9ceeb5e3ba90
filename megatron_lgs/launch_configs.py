"""The named flag sets in launch/configs/*.sh, read the way launch/torchrun.sh reads them.

Each file defines a bash array CONFIG_ARGS; bash itself expands it (quoting, comments, line
continuations), so what Python sees is exactly what the launchers pass to pretrain_gpt.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from megatron_lgs.arguments import parse_args
from megatron_lgs.run_config import Config

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "launch" / "configs"

# The world each config is written for (its header comment); a config missing here is an error,
# so a new one cannot silently escape the checks that need a world size.
WORLD_SIZES = {"tiny-cpu": 1, "gpt-1b": 1, "gpt-10b": 16, "gpt-100b-moe": 128}
GPUS_PER_NODE = 8


def config_names(configs_dir: Path = CONFIGS_DIR) -> list[str]:
    return sorted(p.stem for p in configs_dir.glob("*.sh"))


def config_args(name: str, configs_dir: Path = CONFIGS_DIR) -> list[str]:
    """The CONFIG_ARGS array of launch/configs/NAME.sh, one argv item per element."""
    path = configs_dir / f"{name}.sh"
    if not path.is_file():
        raise ValueError(f"no launch config {name!r}; known: {config_names(configs_dir)}")
    # NUL-separated, so an element may hold any character but NUL, as bash's own may.
    script = ('source "$1" || exit\n'
              '[[ "$(declare -p CONFIG_ARGS 2>/dev/null)" == "declare -a"* ]] || exit 99\n'
              'for arg in "${CONFIG_ARGS[@]}"; do printf "%s\\0" "$arg"; done')
    done = subprocess.run(["bash", "-c", script, "bash", str(path)], capture_output=True,
                          text=True, errors="replace")
    if done.returncode == 99:
        raise ValueError(f"launch config {path} defines no CONFIG_ARGS array")
    if done.returncode:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"launch config {path}: bash could not source it (exit "
                         f"{done.returncode}): {said}")
    return done.stdout.split("\0")[:-1]


def world_size(name: str) -> int:
    try:
        return WORLD_SIZES[name]
    except KeyError:
        raise ValueError(f"launch config {name!r} has no world size in "
                         f"megatron_lgs.launch_configs.WORLD_SIZES") from None


def load_config(name: str, configs_dir: Path = CONFIGS_DIR) -> Config:
    """The trainer's validated Config for a named launch config at its intended world size."""
    return parse_args(config_args(name, configs_dir), world_size=world_size(name))
