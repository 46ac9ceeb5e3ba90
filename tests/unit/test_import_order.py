"""Every module of the package imports when it is the first one a program imports. An import
cycle passes a test suite whose files happen to import its modules in a safe order, and
breaks only the program that starts elsewhere (85f13e9: `run_config` -> `lgs.config` -> ... ->
`runspec` -> `run_config`, found by a clean-clone CI run in a test file that imported the
converters first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One interpreter for all modules (torch, imported once, is what makes a fresh one per module
# take minutes): before each, this package and megatron-core, which it patches on import, leave
# sys.modules, so each module's imports run from the start.
SCRIPT = """
import importlib, json, pathlib, sys
mods = sorted(".".join(p.with_suffix("").parts).removesuffix(".__init__")
              for p in pathlib.Path("megatron_lgs").rglob("*.py"))
failed = {}
for m in mods:
    for k in [k for k in sys.modules if k.split(".")[0] in ("megatron_lgs", "megatron")]:
        del sys.modules[k]
    try:
        importlib.import_module(m)
    except Exception as e:
        failed[m] = repr(e)
print(json.dumps({"modules": mods, "failed": failed}))
"""


def test_every_module_imports_first() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert len(result["modules"]) > 50 and "megatron_lgs.lgs.runspec" in result["modules"]
    assert result["failed"] == {}
