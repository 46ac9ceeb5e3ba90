"""The GPU check's figures file: every figure a GPU test measured, every test's outcome, and the
machine, as one JSON document. `launch/gpu_check.sh` names it with $GPU_FIGURES; it is rewritten
after each test (atomically), so a run stopped at its time limit still leaves what it measured.

    python -m tests.gpu.figures --finish FILE --exit-code RC --seconds S   # the script's last word
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

ENV = "GPU_FIGURES"


def machine() -> dict[str, object]:
    """What ran the check (imports torch lazily: the writer itself needs nothing but json)."""
    import torch

    info: dict[str, object] = {"python": platform.python_version(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "cuda_available":
                               torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, device_memory_gib=round(props.total_memory / 2**30, 1))
    try:  # metadata, not an import: megatron.core must not be imported before megatron_lgs
        info["megatron_core"] = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        pass
    return info


class FigureLog:
    """Figures by test, outcomes by test; `write()` after every change."""

    def __init__(self, path: Path, machine_info: dict[str, object] | None = None) -> None:
        self.path = Path(path)
        self.doc: dict[str, object] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine_info or {}, "figures": {}, "tests": {}}

    def record(self, test: str, name: str, value: float | int | str | None,
               unit: str | None = None) -> None:
        if isinstance(value, float) and value != value:  # NaN is not JSON
            value = None
        entry = {"value": value, **({"unit": unit} if unit else {})}
        self.doc["figures"].setdefault(test, {})[name] = entry
        self.write()

    def outcome(self, test: str, outcome: str, seconds: float, detail: str | None = None) -> None:
        """passed / failed / skipped, how long it took, and the skip reason or the failure's
        last line."""
        entry: dict[str, object] = {"outcome": outcome, "seconds": round(seconds, 2)}
        if detail:
            entry["detail"] = detail
        self.doc["tests"][test] = entry
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, self.path)


def finish(path: Path, exit_code: int, seconds: float) -> dict:
    """Close the document: pytest's exit code and the run's wall time (a file pytest never
    wrote, because it was killed before the first test ended, is created with that alone)."""
    doc = json.loads(path.read_text()) if path.is_file() else \
        {"machine": {}, "figures": {}, "tests": {}}
    doc.update(exit_code=exit_code, seconds=seconds,
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="close the GPU check's figures file")
    parser.add_argument("--finish", type=Path, required=True)
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    doc = finish(args.finish, args.exit_code, args.seconds)
    outcomes = [t["outcome"] for t in doc["tests"].values()]
    print(f"figures: {sum(len(f) for f in doc['figures'].values())} from "
          f"{len(doc['figures'])} tests; tests " + ", ".join(
              f"{outcomes.count(o)} {o}" for o in ("passed", "failed", "skipped")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
