"""The tracker file decides which checkpoint --load uses; it names only complete ones."""

from __future__ import annotations

import pytest

from megatron_lgs.checkpointing import TRACKER_FILE, checkpoint_dir, latest_iteration
from megatron_lgs.run_config import ConfigError


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


class _Payload:
    """Unpickling this runs a shell command: what a tampered checkpoint would carry."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_metadata_with_foreign_objects_is_refused_without_running_them(tmp_path):
    import pickle

    from megatron_lgs.checkpointing import check_metadata

    marker = tmp_path / "pwned"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(ConfigError, match="refusing to load .*posix.system|refusing to load"):
        check_metadata(tmp_path)
    assert not marker.exists()


def test_real_checkpoint_metadata_passes(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    from megatron_lgs.checkpointing import check_metadata

    dcp.save({"w": torch.ones(3, dtype=torch.bfloat16), "step": torch.tensor(4)},
             checkpoint_id=str(tmp_path), no_dist=True)
    check_metadata(tmp_path)
