"""--async-save's writers: a forked writer that never starts is killed and forked again, on the
megatron-core whose caller this subclasses (an upgrade that moves it fails here)."""

from __future__ import annotations

import inspect
import time

import pytest

from megatron_lgs import async_save

# isort: split
# megatron-core only after megatron_lgs, whose import installs the platform layer first.
from megatron.core.dist_checkpointing.strategies import async_utils
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest


def test_megatron_still_forks_the_writer_from_the_caller_the_queue_picks():
    queue_source = inspect.getsource(async_utils.AsyncCallsQueue)
    assert "return TemporalAsyncCaller()" in inspect.getsource(
        async_utils.AsyncCallsQueue._get_async_caller)
    assert "async_caller = self._get_async_caller()" in queue_source
    caller_source = inspect.getsource(async_utils.TemporalAsyncCaller.schedule_async_call)
    assert "mp.get_context('fork')" in caller_source
    assert "target=async_req.async_fn" in caller_source
    assert isinstance(async_save._AnnouncedCallsQueue()._get_async_caller(),
                      async_save.AnnouncedWriter)


def _hang_on_first_fork(marker, real):
    def announce_then_run(announce, write, *args, **kwargs):
        if not marker.exists():  # in the first forked writer only: stuck, as in gh-112275
            marker.touch()
            time.sleep(30)  # past the test's start timeout: without the re-fork this fails
        real(announce, write, *args, **kwargs)
    return announce_then_run


def test_a_writer_that_never_starts_is_killed_and_forked_again(monkeypatch, tmp_path,
                                                               one_rank_group, capsys):
    stuck = tmp_path / "stuck"
    monkeypatch.setattr(async_save, "_announce_then_run",
                        _hang_on_first_fork(stuck, async_save._announce_then_run))
    monkeypatch.setattr(async_save, "START_TIMEOUT_S", 1.0)
    written = tmp_path / "written"
    writer = async_save.AnnouncedWriter()
    writer.schedule_async_call(AsyncRequest(written.write_text, ("state",), []))
    assert writer.is_current_async_call_done(blocking=True)
    assert stuck.exists() and written.read_text() == "state"
    assert "did not start within 1 s" in capsys.readouterr().err


def test_a_writer_that_never_starts_in_any_fork_is_a_clear_error(monkeypatch, tmp_path,
                                                                 one_rank_group):
    def never(announce, write, *args, **kwargs):
        time.sleep(30)
    monkeypatch.setattr(async_save, "_announce_then_run", never)
    monkeypatch.setattr(async_save, "START_TIMEOUT_S", 0.5)
    monkeypatch.setattr(async_save, "START_ATTEMPTS", 2)
    writer = async_save.AnnouncedWriter()
    with pytest.raises(RuntimeError, match="no checkpoint writer started in 2 forks"):
        writer.schedule_async_call(AsyncRequest((tmp_path / "x").write_text, ("state",), []))
    assert writer.process is None
