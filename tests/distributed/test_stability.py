"""Stability and graceful exit, end to end: injected NaN and spikes, skip and rollback, SIGTERM,
and the logging sinks (TensorBoard, W&B offline, report)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, TINY_GPT, Run, _base_env, run_pretrain

pytestmark = pytest.mark.slow

K = 9  # the poisoned iteration
RUN = ["--train-iters", "14", "--loss-spike-window", "6", "--log-interval", "2"]


def _by_iteration(run: Run) -> dict[int, dict]:
    """The last record of each iteration (a rollback replays some)."""
    return {r["iteration"]: r for r in run.records("train")}


@pytest.fixture(scope="module")
def never_saw_batch_k(tmp_path_factory, data_cache) -> dict[int, dict]:
    save = tmp_path_factory.mktemp("skip-k")
    run = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *RUN,
                        "--iterations-to-skip", str(K)], save_dir=save)
    records = _by_iteration(run)
    assert records[K]["skipped"] and records[K]["reason"] == "in --iterations-to-skip"
    return records


def _after_k_equal(records: dict[int, dict], reference: dict[int, dict]) -> None:
    assert sorted(records) == sorted(reference)
    for iteration in range(K + 1, max(reference) + 1):
        assert records[iteration]["loss"] == reference[iteration]["loss"], iteration


def test_injected_nan_is_skipped_counted_and_harmless(never_saw_batch_k, tiny, tmp_path):
    run = run_pretrain([*tiny, *RUN, "--inject-nan-at", str(K)], save_dir=tmp_path / "c")
    records = _by_iteration(run)
    assert records[K]["skipped"] and records[K]["reason"] == "nan"
    assert f"iteration {K}: nan; update skipped" in run.stdout
    (last_log,) = [r for r in run.records("log") if r["iteration"] == 14]
    assert last_log["nan_iterations"] == 1 and last_log["skipped_iterations"] == 1
    _after_k_equal(records, never_saw_batch_k)


def test_spike_with_skip_does_not_move_the_weights(never_saw_batch_k, tiny, tmp_path):
    run = run_pretrain([*tiny, *RUN, "--inject-spike-at", str(K), "--loss-spike-action",
                        "skip"], save_dir=tmp_path / "c")
    records = _by_iteration(run)
    assert records[K]["skipped"] and records[K]["reason"] == "loss spike"
    _after_k_equal(records, never_saw_batch_k)


def test_spike_with_log_is_reported_and_applied(never_saw_batch_k, tiny, tmp_path):
    run = run_pretrain([*tiny, *RUN, "--inject-spike-at", str(K)], save_dir=tmp_path / "c")
    records = _by_iteration(run)
    assert not records[K]["skipped"] and records[K]["reason"] == "loss spike"
    assert records[K + 1]["loss"] != never_saw_batch_k[K + 1]["loss"]


def test_spike_with_rollback_resumes_from_the_checkpoint_and_skips_the_batch(
        never_saw_batch_k, tiny, tmp_path):
    run = run_pretrain([*tiny, *RUN, "--inject-spike-at", str(K), "--loss-spike-action",
                        "rollback", "--save-interval", "5"], save_dir=tmp_path / "c")
    assert "rolled back to iteration 5" in run.stdout
    records = _by_iteration(run)
    assert records[K]["reason"] == "in --iterations-to-skip"  # replayed as a skip
    _after_k_equal(records, never_saw_batch_k)
    assert records[14]["loss"] == never_saw_batch_k[14]["loss"]


def test_a_run_rewound_with_ckpt_step_rolls_back_to_its_own_checkpoint(never_saw_batch_k,
                                                                        tiny, tmp_path):
    """Rewound to iteration 5 in the folder that holds 10 and 14 (the run rewound from), a spike
    at 9 rolls back to 5, the newest checkpoint of this run, not to 14; until 2026-12-08 a
    rollback went to the folder's newest."""
    save = tmp_path / "c"
    run_pretrain([*tiny, *RUN, "--save-interval", "5"], save_dir=save)
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "14"
    run = run_pretrain([*tiny, *RUN, "--save-interval", "5", "--load", str(save), "--ckpt-step",
                        "5", "--inject-spike-at", str(K), "--loss-spike-action", "rollback"],
                       save_dir=save)
    assert "at iteration 5" in run.stdout and "iteration(s) 10, 14 under" in run.stdout
    assert "rolled back to iteration 5" in run.stdout
    records = _by_iteration(run)
    assert records[K]["reason"] == "in --iterations-to-skip"
    _after_k_equal(records, never_saw_batch_k)


def test_sigterm_saves_exits_zero_and_resumes_bit_exactly(tiny, tmp_path):
    args = [*tiny, "--train-iters", "40", "--log-interval", "1", "--exit-signal-handler"]
    straight = run_pretrain(args, save_dir=tmp_path / "straight").losses()

    save = tmp_path / "signalled"
    proc = subprocess.Popen([sys.executable, "pretrain_gpt.py", *args, "--save", str(save)],
                            cwd=REPO, env=_base_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = save / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait until training is under way
        if metrics.exists() and metrics.read_text().count('"train"') >= 3:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "received SIGTERM" in stdout
    stopped_at = int((save / "latest_checkpointed_iteration.txt").read_text())
    assert 3 <= stopped_at < 40
    resumed = run_pretrain([*args, "--load", str(save)], save_dir=save)
    assert resumed.losses() == straight


def test_tensorboard_wandb_and_report(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save = tmp_path / "run"
    run = run_pretrain([*tiny, "--train-iters", "6", "--log-interval", "2", "--tensorboard-dir",
                        str(tmp_path / "tb"), "--wandb-project", "lgs-test", "--wandb-save-dir",
                        str(tmp_path)], save_dir=save,
                       env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("lm loss", "learning rate", "grad norm", "tokens per second",
                "validation lm loss", "grad norm/layer 1"):
        assert tag in tags, tag
    logged = [e.value for e in events.Scalars("lm loss")]
    console = [r["lm_loss"] for r in run.records("log")]
    assert logged == pytest.approx(console)
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))

    report = subprocess.run([sys.executable, "-m", "megatron_lgs.report", str(save)], cwd=REPO,
                            env=_base_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    for name in ("loss.png", "learning_rate.png", "grad_norm.png", "throughput.png",
                 "layer_grad_norms.png"):
        png = save / "report" / name
        assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    summary = (save / "report" / "summary.md").read_text()
    assert "MoE expert load imbalance (max/mean) | not recorded" in summary


def test_exit_duration_saves_and_exits_zero(tiny, tmp_path):
    run = run_pretrain([*tiny, "--train-iters", "1000", "--exit-duration-in-mins", "0.0001"],
                       save_dir=tmp_path / "c")
    assert "time budget spent (--exit-duration-in-mins)" in run.stdout
    assert int((tmp_path / "c" / "latest_checkpointed_iteration.txt").read_text()) < 1000
