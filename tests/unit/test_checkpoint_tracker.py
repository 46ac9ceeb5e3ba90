"""The tracker file decides which checkpoint --load uses; it names only complete ones."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import ConfigError
from megatron_lgs.checkpointing import TRACKER_FILE, checkpoint_dir, latest_iteration


def test_no_tracker_means_fresh_start(tmp_path):
    assert latest_iteration(str(tmp_path)) is None


def test_tracker_names_a_complete_directory(tmp_path):
    checkpoint_dir(str(tmp_path), 10).mkdir()
    (tmp_path / "iter_0000020.partial").mkdir()  # a save that never finished
    (tmp_path / TRACKER_FILE).write_text("10\n")
    assert latest_iteration(str(tmp_path)) == 10


@pytest.mark.parametrize("content, message", [("ten", "iteration number"),
                                               ("30", "is missing")])
def test_a_broken_tracker_is_a_clear_error(tmp_path, content, message):
    (tmp_path / TRACKER_FILE).write_text(content)
    with pytest.raises(ConfigError, match=message):
        latest_iteration(str(tmp_path))
