"""python -m megatron_lgs.report on a synthetic run folder: the summary it writes, and bad input
in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_lgs.report import main


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    records = [{"event": "log", "iteration": i, "lm_loss": 8.0 - i, "tokens_per_second": 1e3}
               for i in (1, 2)]
    records.append({"event": "valid", "iteration": 2, "loss": 6.5})
    lines = [json.dumps(r) for r in records] + ['{"event": "log", "iteration": 3, "lm_lo']
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_report_writes_its_summary_and_counts_a_torn_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    run = _run_dir(tmp_path)
    main([str(run), "--out", str(tmp_path / "rep")])
    captured = capsys.readouterr()
    assert "skipping malformed line 4" in captured.err
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "validation loss: 6.5000 (iteration 2)" in summary
    assert (tmp_path / "rep" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("out,said", [("/proc/no/such/dir", "No such file"),
                                      ("{run}/metrics.jsonl", "File exists")])
def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path: Path, out: str,
                                                       said: str) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([str(run), "--out", out.format(run=run)])
    message = str(exc.value.code)
    assert message.startswith("report: error: --out ") and said in message, message
    assert "\n" not in message
