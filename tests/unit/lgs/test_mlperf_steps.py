"""bench/mlperf_steps.py: step times from MLPerf Training's MLLOG lines, as the MLPerf table
rows of bench/mlperf_rows.py take them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from mlperf_steps import (  # noqa: E402
    SystemSteps,
    logged_step_times,
    main,
    mllog_events,
    system_step_times,
)
from mlperf_steps import block_step_times as _block_step_times  # noqa: E402


def block_step_times(log: str) -> tuple[list[float], int | None]:
    return _block_step_times(mllog_events(log))


def _line(key: str, value: object = None, time_ms: int = 0, **meta: object) -> str:
    event = {"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key,
             "value": value, "metadata": {"file": "x.py", "lineno": 1, **meta}}
    return ":::MLLOG " + json.dumps(event)


def _log(blocks: list[tuple[int, int, int]], batch: int = 4, seq: int = 8) -> str:
    """A result file: the batch, then (start ms, stop ms, tokens) blocks with an evaluation
    between them that no block contains."""
    lines = [":::SYSJSON {}", "some trainer output", _line("global_batch_size", batch),
             _line("max_sequence_length", seq)]
    for start, stop, tokens in blocks:
        lines += [_line("block_start", time_ms=start, first_epoch_num=start, epoch_count=tokens),
                  _line("block_stop", time_ms=stop, first_epoch_num=start,
                        epoch_count=tokens),
                  _line("eval_start", time_ms=stop + 1), _line("eval_stop", time_ms=stop + 500)]
    return "\n".join(lines)


def test_a_blocks_step_time_is_its_duration_over_its_steps() -> None:
    # 4 x 8 = 32 tokens a step: 320 tokens are 10 steps; 20 s over 10 steps is 2 s a step.
    steps, batch = block_step_times(_log([(1000, 21000, 320), (30000, 52000, 320)]))
    assert batch == 4
    assert steps == pytest.approx([2.0, 2.2])


def test_a_block_spanning_the_whole_run_gives_no_step_time() -> None:
    # One step's worth of tokens (round 3.0's single block holds the run, evaluations too).
    assert block_step_times(_log([(0, 5000, 32)]))[0] == []


def test_systems_take_the_median_of_all_blocks_of_all_runs(tmp_path: Path) -> None:
    system = tmp_path / "Vendor" / "results" / "box_n8" / "gpt3"
    system.mkdir(parents=True)
    (system / "result_0.txt").write_text(_log([(0, 10000, 320), (20000, 30000, 320)]))
    (system / "result_1.txt").write_text(_log([(0, 40000, 320)]))
    (tmp_path / "Vendor" / "results" / "box_n8" / "bert").mkdir()
    assert system_step_times(tmp_path) == {
        "Vendor/box_n8": SystemSteps(pytest.approx(1.0), 4, 3, None, 0)}


def test_the_trainers_own_step_times_are_read_under_each_spelling(tmp_path: Path) -> None:
    """NeMo's per-step times (5.x `train_step_time`, earlier `train_step_timing` and
    `train_step_timing in s`); other tracked stats and other events are not step times."""
    stats = [{"train_step_time": 2.5, "reduced_train_loss": 7.1}, {"warmup_time": 370.0},
             {"train_step_timing": 2.0}, {"train_step_timing in s": 3.0}, {"init_finished": 0.1}]
    lines = [_line("tracked_stats", value) for value in stats]
    lines.append(_line("eval_accuracy", 2.2))
    assert logged_step_times(mllog_events("\n".join(lines))) == [2.5, 2.0, 3.0]
    system = tmp_path / "Vendor" / "results" / "box_n8" / "gpt3"
    system.mkdir(parents=True)
    (system / "result_0.txt").write_text("\n".join([_log([(0, 10000, 320)]), *lines]))
    assert system_step_times(tmp_path)["Vendor/box_n8"] == SystemSteps(
        pytest.approx(1.0), 4, 1, 2.5, 3)


def _samples_log(blocks: list[tuple[int, int, int]], batch: int = 4,
                 block_counts: str = "trained") -> str:
    """A result file of the Llama 3.1 rounds: each evaluation counts the samples trained before
    it; a block's start and stop carry the samples trained before the block (NVIDIA's logs,
    `block_counts` "trained") or the block's own length (HPE's, "length")."""
    lines = [_line("global_batch_size", batch), _line("max_sequence_length", 8)]
    trained = 0
    for start, stop, samples in blocks:
        count = trained if block_counts == "trained" else samples
        lines += [_line("block_start", time_ms=start, samples_count=count),
                  _line("block_stop", time_ms=stop, samples_count=count)]
        trained += samples
        lines += [_line("eval_start", time_ms=stop + 1, samples_count=trained),
                  _line("eval_stop", time_ms=stop + 500, samples_count=trained)]
    return "\n".join(lines)


@pytest.mark.parametrize("block_counts", ["trained", "length"])
def test_samples_count_logs_time_a_block_over_the_samples_it_trained(block_counts: str) -> None:
    # 40 samples at a batch of 4 are 10 steps: 20 s over 10 steps is 2 s a step; the second
    # block holds 20 steps (80 samples) in 30 s. A log cut after a block's stop, before the
    # evaluation that would count its samples, gives that block no step time.
    log = _samples_log([(1000, 21000, 40), (30000, 60000, 80)], block_counts=block_counts)
    assert block_step_times(log) == (pytest.approx([2.0, 1.5]), 4)
    cut = log.rsplit("\n", 2)[0]
    assert block_step_times(cut)[0] == pytest.approx([2.0])


def test_a_clone_without_timed_results_is_an_error_not_silence(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and f"no timed gpt3 results under {tmp_path}" \
        in err[0]
