"""The GPU tests' figures: with $GPU_FIGURES set (launch/gpu_check.sh sets it), every figure a
test records through the `figures` fixture and every test's outcome go to that JSON file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gpu.figures import ENV, FigureLog, machine

_LOG: FigureLog | None = None


def _log() -> FigureLog | None:
    global _LOG
    if _LOG is None and os.environ.get(ENV):
        _LOG = FigureLog(Path(os.environ[ENV]), machine())
        _LOG.write()
    return _LOG


Record = Callable[..., None]


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Record:
    """record(name, value, unit=None): one figure of this test (printed; kept in the file)."""
    def record(name: str, value, unit: str | None = None) -> None:
        print(f"\n figure {request.node.name}: {name} = {value}{' ' + unit if unit else ''}")
        log = _log()
        if log is not None:
            log.record(request.node.nodeid, name, value, unit)
    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    log = _log()
    if log is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed) or \
            (report.when == "teardown" and report.failed):
        detail = None
        if report.skipped and isinstance(report.longrepr, tuple):
            detail = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            lines = str(report.longrepr).strip().splitlines()
            detail = next((ln for ln in reversed(lines) if ln.startswith("E ")), lines[-1])
        log.outcome(report.nodeid, report.outcome, report.duration, detail)
