"""The local pool fails with a one-line error, instead of waiting forever, when its manager
thread dies with tasks pending (seen once in CI: a prepare hung for 30 minutes on a pool with no
workers and no manager thread)."""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from corpus_helpers import STAGED as FLAGS
from corpus_helpers import prepare_corpus

from data_pipeline.executors.local import LocalExecutor


def test_manager_thread_name_is_pinned():
    """wait_on_pool reads CPython's private ``_executor_manager_thread``."""
    pool = ProcessPoolExecutor(max_workers=1)
    try:
        assert pool._executor_manager_thread is None
        assert pool.submit(abs, -3).result() == 3
        assert pool._executor_manager_thread.is_alive()
    finally:
        pool.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_manager_thread_is_an_error_not_a_hang(corpus, tmp_path, monkeypatch):
    """One worker, one task per process: after the first task the manager thread forks the
    replacement worker; that fork fails, the thread dies, and the other tasks stay pending."""
    spawn = ProcessPoolExecutor._spawn_process
    calls = []

    def first_spawn_only(self):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("injected: cannot fork the replacement worker")
        spawn(self)

    monkeypatch.setattr(ProcessPoolExecutor, "_spawn_process", first_spawn_only)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"stopped with \d+ of \d+ read tasks unfinished"):
        prepare_corpus(corpus, tmp_path / "ds", executor=LocalExecutor(1), **FLAGS)
    assert len(calls) == 2
    assert time.monotonic() - start < 60
