"""Imported once by the local executor's fork server, so every task process (forked from it)
inherits ready-made what each would otherwise build for itself: the pipeline's modules and the
shingle view's Unicode tables (~0.4 s per process)."""

import importlib

from data_pipeline import shingle_text
from data_pipeline.stages import STAGES

importlib.import_module("data_pipeline.stages.task")
for _stage in STAGES:
    importlib.import_module(f"data_pipeline.stages.{_stage}")
shingle_text.warm()
