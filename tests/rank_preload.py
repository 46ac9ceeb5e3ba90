"""What the forkserver of tests/forked_ranks.py imports once for every rank it forks: the
modules a rank of pretrain_gpt.py imports (and megatron-core's, through them)."""

import data_pipeline.prepare  # noqa: F401  (the embedded corpus's first preparation, webdataset)
import megatron_lgs.checkpointing  # noqa: F401
import megatron_lgs.training  # noqa: F401
import pretrain_gpt  # noqa: F401
