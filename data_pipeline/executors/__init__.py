"""Where a stage's tasks run: ``local`` (a process pool on this machine) or ``slurm`` (one job
array per stage, chained with ``--dependency=afterok``). Both run the same ``stages.task``
function, so their outputs are identical."""

from __future__ import annotations


class TaskFailed(Exception):
    """A task failed for a reason other than bad input; the message names its log."""
