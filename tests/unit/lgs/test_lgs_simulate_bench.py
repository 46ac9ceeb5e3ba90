"""bench/lgs_simulate.py runs and prints every row and ratio column (its numbers are predictions,
reported, never asserted beyond their internal consistency)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, _base_env

ROWS = ["PyTorch DDP 25 MB", "Megatron default", "DeepSpeed 5e8", "seed 160/24 MB", "LGS optimum"]


@pytest.fixture(scope="module")
def output() -> str:
    proc = subprocess.run([sys.executable, "bench/lgs_simulate.py", "--hardware", "h100-ndr"],
                          cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def sections(out: str) -> dict[str, list[str]]:
    parts = out.split("\n## ")[1:]
    return {p.splitlines()[0]: p.splitlines()[1:] for p in parts}


def test_every_config_has_every_row_and_ratio(output):
    assert output.startswith("# PREDICTION")
    secs = sections(output)
    titles = " ".join(secs)
    for name in ("gpt-10b.sh", "gpt-100b (simulator preset", "gpt-100b-moe.sh"):
        assert name in titles
    for title, lines in secs.items():
        assert "step/Megatron" in lines[0] and "exposed/Megatron" in lines[0], title
        rows = {r[:18].strip(): r[18:].split() for r in lines[1:] if r[:18].strip() in ROWS}
        assert list(rows) == ROWS, title
        megatron_step = float(rows["Megatron default"][2])
        assert rows["Megatron default"][5] == "1.00000"
        for name, cols in rows.items():
            step, ratio = float(cols[2]), float(cols[5])
            assert ratio == pytest.approx(step / megatron_step, abs=1e-4), (title, name)
            assert cols[6] in ("n/a", "1.000") or float(cols[6]) >= 0


def test_rows_carry_their_thresholds(output):
    for lines in sections(output).values():
        rows = {r[:18].strip(): r[18:].split() for r in lines[1:]}
        assert rows["PyTorch DDP 25 MB"][:2] == ["25.0", "bucket"]  # one collective a bucket
        assert rows["seed 160/24 MB"][:2] == ["160.0", "24.0"]
        assert rows["DeepSpeed 5e8"][:2] == ["1907.3", "bucket"]  # 5e8 fp32 elements in MiB
