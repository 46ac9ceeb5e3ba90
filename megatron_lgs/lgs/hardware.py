"""Hardware profiles as files: what `--lgs-hardware PATH.json` reads and the probe writes.

A profile file holds the cost model's constants (`costmodel.HardwareProfile`: per-level latency
and bus bandwidth, ranks per node, FLOP rate, memory) and, for a measured profile, the raw
samples they were fitted from. `resolve_profile` turns any `--lgs-hardware` value except
`measured` (which `calibrate` answers by probing the running job) into a profile.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from megatron_lgs.lgs.costmodel import HardwareProfile, Link
from megatron_lgs.lgs.gpus import PROFILES

FORMAT = "megatron-lgs-hardware-profile"
VERSION = 1
MEASURED = "measured"  # --lgs-hardware measured: run the calibration probe at start-up


class ProfileError(ValueError):
    """A profile file that cannot be used; the message is one line naming the file."""


def profile_to_dict(hw: HardwareProfile, measurements: dict[str, Any] | None = None) -> dict:
    out = {"format": FORMAT, "version": VERSION, **asdict(hw)}
    if measurements is not None:
        out["measurements"] = measurements
    return out


def save_profile(hw: HardwareProfile, path: str | Path,
                 measurements: dict[str, Any] | None = None) -> Path:
    """Write `hw` (and the samples behind it) as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile_to_dict(hw, measurements), indent=1) + "\n")
    return path


def _number(d: dict, key: str, where: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where}: '{key}' must be a finite number, got {value!r}")
    return float(value)


def profile_from_dict(d: Any, where: str) -> HardwareProfile:
    """A profile from parsed JSON; `where` (the file) prefixes every error."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ProfileError(f"{where}: not a hardware profile (no \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise ProfileError(f"{where}: profile version {d.get('version')!r}, this code reads "
                           f"{VERSION}")
    try:
        links = {}
        for level in ("intra", "inter"):
            link = d.get(level)
            if not isinstance(link, dict):
                raise ProfileError(f"{where}: '{level}' must be an object with alpha_s and "
                                   "bandwidth_Bps")
            links[level] = Link(_number(link, "alpha_s", f"{where} {level}"),
                                _number(link, "bandwidth_Bps", f"{where} {level}"))
        gpus = d.get("gpus_per_node")
        if isinstance(gpus, bool) or not isinstance(gpus, int):
            raise ProfileError(f"{where}: 'gpus_per_node' must be an integer, got {gpus!r}")
        efficiency = d.get("efficiency")
        return HardwareProfile(
            name=str(d.get("name") or Path(where).stem), intra=links["intra"],
            inter=links["inter"], gpus_per_node=gpus,
            peak_flops=_number(d, "peak_flops", where),
            memory_bytes=_number(d, "memory_bytes", where), source=str(d.get("source", where)),
            efficiency=None if efficiency is None else _number(d, "efficiency", where),
            overlap=_number(d, "overlap", where) if "overlap" in d else 1.0,
            intra_overlap=(_number(d, "intra_overlap", where)
                           if d.get("intra_overlap") is not None else None))
    except ProfileError:
        raise
    except ValueError as exc:  # the dataclasses' own range checks
        raise ProfileError(f"{where}: {exc}") from None


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile file; any problem is a `ProfileError` with a one-line message."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read hardware profile ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return profile_from_dict(data, where)


def load_measurements(path: str | Path) -> dict[str, Any]:
    """The raw samples a measured profile file carries ({} when none)."""
    return json.loads(Path(path).read_text()).get("measurements", {})


def is_profile_path(spec: str) -> bool:
    """Whether a `--lgs-hardware` value names a file rather than a built-in profile."""
    return spec not in PROFILES and spec != MEASURED


def resolve_profile(spec: str | HardwareProfile | None, default: str) -> HardwareProfile:
    """A profile from a built-in name, a file path or an already built profile."""
    if isinstance(spec, HardwareProfile):
        return spec
    spec = spec or default
    if spec in PROFILES:
        return PROFILES[spec]
    if spec == MEASURED:
        raise ValueError("--lgs-hardware measured is answered by the calibration probe "
                         "(megatron_lgs.lgs.calibrate), which needs the running job")
    if not spec.endswith(".json") and not Path(spec).exists():
        raise ValueError(f"unknown hardware profile {spec!r}; known: {sorted(PROFILES)}, "
                         f"'{MEASURED}' or a profile file (.json)")
    return load_profile(spec)
