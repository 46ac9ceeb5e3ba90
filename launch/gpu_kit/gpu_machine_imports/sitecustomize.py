"""Imports as on the GPU machine, simulated here. With this folder first on PYTHONPATH, the
interpreter's site-packages is replaced on sys.path by a view (a temporary folder of symbolic
links) holding only what the GPU machine has: its preinstalled distributions and the kit (see
../fetch_wheels.py). A module only other distributions provide is then simply absent, for
imports and for `find_spec` probes alike. The CPU suite runs the trainer and the GPU tests'
collection this way, so a run-time import the kit lacks fails here, not in the rare GPU window.
Entries no distribution claims stay visible."""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fetch_wheels import dist_name, gpu_machine_distributions  # noqa: E402

sys.path.pop(0)


def _visible(entry: str, owners: dict[str, list[str]], allowed: set[str]) -> bool:
    if entry.endswith(".pth") or entry == "__pycache__":
        return False
    if entry.endswith((".dist-info", ".egg-info")):
        return dist_name(entry.split("-")[0]) in allowed
    top = entry.split(".")[0]
    return top not in owners or any(dist_name(d) in allowed for d in owners[top])


def _install() -> None:
    allowed = gpu_machine_distributions()
    owners = importlib.metadata.packages_distributions()
    view = Path(tempfile.mkdtemp(prefix="gpu-machine-site-"))
    atexit.register(shutil.rmtree, view, True)
    for i, entry in enumerate(sys.path):
        if not entry.endswith("site-packages") or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            if _visible(name, owners, allowed) and not (view / name).exists():
                (view / name).symlink_to(Path(entry) / name)
        sys.path[i] = str(view)
    importlib.invalidate_caches()


_install()
