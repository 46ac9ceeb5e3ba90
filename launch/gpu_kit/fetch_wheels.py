"""Fetch, here, the wheels the GPU test machine lacks, and print the command to run there.

The GPU machine has no network. It has Python 3.12 at /opt/torch/.venv/bin/python3 with torch
2.11.0+cu130 and the packages in `GPU_MACHINE_HAS` (with whatever those depend on). Everything
else that the GPU tests import at run time travels with the working tree as wheels in
`launch/gpu_kit/wheels/` (git-ignored), at most 64 MiB together with the tree itself, and
`launch/gpu_check.sh` installs them there with `pip install --no-index --no-deps --target`.

    .venv/bin/python launch/gpu_kit/fetch_wheels.py          # download, check size, print
    .venv/bin/python launch/gpu_kit/fetch_wheels.py --check  # only check the folder's size

Exit 2 with one line when the kit would not fit or a download fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIR = REPO / "launch" / "gpu_kit" / "wheels"
LIMIT_BYTES = 64 * 2**20  # what travels to the GPU machine: the working tree plus carried paths
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux_2_28_x86_64"

# Preinstalled on the GPU machine (the list); pip installed their dependencies with them
# (tokenizers -> huggingface-hub -> pyyaml, tqdm, fsspec, filelock; torch -> sympy, jinja2, ...).
GPU_MACHINE_HAS = ("torch", "einops", "psutil", "numpy", "packaging", "tokenizers",
                   "tensorboard", "matplotlib", "safetensors", "transformers")
# transformers is not installed on the CPU machine, so its declared requirements are listed here.
TRANSFORMERS_REQUIRES = ("filelock", "huggingface-hub", "numpy", "packaging", "pyyaml", "regex",
                         "requests", "safetensors", "tokenizers", "tqdm")

# What the GPU tests import at run time and the GPU machine lacks, at this repo's pins
# (requirements.txt). The trainer's data path needs webdataset (shards); pytest runs the tests.
# Left out on purpose: datasets/pyarrow (parquet input only; pyarrow alone is ~45 MB), datasketch
# (the MinHash reference of the unit tests), wandb (an optional sink), Transformer Engine (179 MB
# core wheel, and its PyTorch extension has no binary wheel).
KIT = (
    "megatron-core==0.16.1",
    "webdataset==1.0.2",
    "braceexpand==0.1.7",  # webdataset's
    "pytest==9.2.0",
    "pluggy==1.7.0",  # pytest's
    "iniconfig==2.3.1",  # pytest's
    "pygments==2.21.0",  # pytest's
)

GPU_PYTHON = "/opt/torch/.venv/bin/python3"


def dist_name(requirement: str) -> str:
    """The normalized distribution name of a requirement string ('PyYAML>=5' -> 'pyyaml')."""
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower() \
        .replace("_", "-").replace(".", "-")


def gpu_machine_distributions() -> set[str]:
    """Distributions the GPU machine has: `GPU_MACHINE_HAS` and what they require, read from
    this machine's installed metadata with Python 3.12's markers, plus the kit."""
    from packaging.requirements import Requirement

    env = {"python_version": PYTHON_VERSION, "python_full_version": PYTHON_VERSION + ".0",
           "extra": ""}
    have: set[str] = set()
    todo = [*GPU_MACHINE_HAS, *TRANSFORMERS_REQUIRES]
    while todo:
        name = dist_name(todo.pop())
        if name in have:
            continue
        have.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [r for r in requires if Requirement(r).marker is None
                 or Requirement(r).marker.evaluate(env)]
    return have | {dist_name(r) for r in KIT}


class KitError(Exception):
    """A kit that cannot be built or would not fit: reported in one line, exit 2."""


def travelling_tree_bytes(repo: Path = REPO) -> int:
    """Bytes of the working tree that the device tool copies: tracked files and untracked files
    git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=repo, capture_output=True, check=True)
    paths = {repo / p for p in listed.stdout.decode().split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file())


def wheels(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.whl"))


def check_size(folder: Path, tree_bytes: int, limit: int = LIMIT_BYTES) -> int:
    """Total bytes of the wheels in `folder`; KitError when they and the tree exceed `limit`."""
    if not wheels(folder):
        raise KitError(f"no wheels in {folder}")
    total = sum(p.stat().st_size for p in wheels(folder))
    if total + tree_bytes > limit:
        raise KitError(f"the GPU kit is {total / 2**20:.1f} MiB of wheels + "
                       f"{tree_bytes / 2**20:.1f} MiB of working tree, over the "
                       f"{limit / 2**20:.0f} MiB that travels to the GPU machine")
    return total


def download(requirements: tuple[str, ...], folder: Path) -> None:
    """pip download, for CPython 3.12 on manylinux_2_28 x86_64, without dependencies (the kit
    lists each wheel it needs; what the GPU machine has must not be fetched again)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in wheels(folder):  # gpu_check.sh installs every wheel there: no leftovers
        stale.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
           "--platform", PLATFORM, "--dest", str(folder), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise KitError(f"pip download failed: {last}")


def device_command(folder: Path = WHEEL_DIR, repo: Path = REPO) -> str:
    """The one bash command for the device tool (at most 2000 characters), with `folder` named
    in its carry list; it runs in the repository root there and writes to $OUT."""
    rel = folder.relative_to(repo)
    return f"GPU_KIT={rel} PYTHON={GPU_PYTHON} bash launch/gpu_check.sh"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the folder's size")
    parser.add_argument("--dest", type=Path, default=WHEEL_DIR)
    args = parser.parse_args(argv)
    dest = args.dest.resolve()
    try:
        if not dest.is_relative_to(REPO):
            raise KitError(f"{dest} is outside the repository; the device tool carries only "
                           f"paths inside it")
        if not args.check:
            download(KIT, dest)
        tree = travelling_tree_bytes()
        total = check_size(dest, tree)
    except KitError as exc:
        print(f"gpu_kit: {exc}", file=sys.stderr)
        return 2
    for wheel in wheels(dest):
        print(f"  {wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"  {total / 2**20:7.2f} MiB of wheels + {tree / 2**20:.2f} MiB of working tree "
          f"(limit {LIMIT_BYTES / 2**20:.0f} MiB)")
    print(f"device tool: carry [\"{dest.relative_to(REPO)}\"], timeout_s 480, command:")
    print(device_command(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
