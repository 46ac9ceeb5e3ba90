"""The trainer on prepared datasets: --data-path blends, and dynamic domain weights driven by
per-domain validation loss, resumed exactly in the middle of a window."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_GPT, _base_env, run_pretrain

pytestmark = pytest.mark.slow

MIX = ["--data-mix", "dynamic", "--data-mix-interval", "4", "--eval-iters", "2",
       "--data-mix-floor", "0.1"]


def _write_domain(folder: Path, texts: list[str]) -> None:
    folder.mkdir(parents=True)
    with open(folder / "docs.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


@pytest.fixture(scope="module")
def easy_hard(tmp_path_factory) -> Path:
    """'easy': one sentence repeated (learnable at once); 'hard': random letters (not)."""
    root = tmp_path_factory.mktemp("easy-hard")
    rng = random.Random(0)
    sentence = "the quick brown fox jumps over the lazy dog and runs home. "
    _write_domain(root / "src" / "easy", [f"story {i}. " + sentence * 40 for i in range(120)])
    _write_domain(root / "src" / "hard", [
        " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
                 for _ in range(300)) for _ in range(120)])
    proc = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "prepare", "--domain", f"easy={root}/src/easy",
         "--domain", f"hard={root}/src/hard", "--vocab-size", "512", "--no-near-dedup",
         "--output", str(root / "dataset")],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "dataset"


def _mix_records(run) -> list[dict]:
    return run.records("data_mix")


def test_the_hard_domain_gains_weight_within_bounds(easy_hard, tmp_path):
    args = [*TINY_GPT, "--data-path", str(easy_hard), "--domain-weights", "easy=0.5",
            "hard=0.5", "--train-iters", "12", *MIX]
    run = run_pretrain(args, save_dir=tmp_path / "c")
    mixes = _mix_records(run)
    assert [m["iteration"] for m in mixes] == [4, 8, 12]
    assert all(m["loss.hard"] > m["loss.easy"] for m in mixes)
    hard = [0.5] + [m["weight.hard"] for m in mixes]
    assert all(b > a for a, b in zip(hard, hard[1:], strict=False)), hard
    assert all(0.1 <= m["weight.easy"] <= 0.9 and 0.1 <= m["weight.hard"] <= 0.9 for m in mixes)
    # every training step records the weights its samples were drawn with
    train = run.records("train")
    assert train[4]["weight.hard"] == mixes[0]["weight.hard"]  # iteration 5: the new window


def test_resume_mid_window_reproduces_weights_and_samples(easy_hard, tmp_path):
    args = [*TINY_GPT, "--data-path", str(easy_hard), "--domain-weights", "easy=0.5",
            "hard=0.5", "--train-iters", "12", *MIX]
    straight = run_pretrain(args, save_dir=tmp_path / "a")
    stopped = tmp_path / "b"
    run_pretrain([*args, "--exit-interval", "6"], save_dir=stopped)
    resumed = run_pretrain([*args, "--load", str(stopped), "--num-workers", "2"],
                           save_dir=stopped)
    assert resumed.losses() == straight.losses()
    weights = [{k: v for k, v in r.items() if k.startswith("weight.")}
               for r in straight.records("train")]
    assert [{k: v for k, v in r.items() if k.startswith("weight.")}
            for r in resumed.records("train")] == weights


def test_data_path_weight_pairs_blend_two_prepared_datasets(easy_hard, tmp_path):
    run = run_pretrain([*TINY_GPT, "--data-path", "0.3", str(easy_hard), "0.7", str(easy_hard),
                        "--train-iters", "3"], save_dir=tmp_path / "c", expect_success=False)
    assert run.returncode == 2 and "names a directory twice" in run.stderr
    run = run_pretrain([*TINY_GPT, "--data-path", str(easy_hard), "--train-iters", "4"],
                       save_dir=tmp_path / "d")
    assert len(run.losses()) == 4 and run.losses()[-1] < run.losses()[0]
