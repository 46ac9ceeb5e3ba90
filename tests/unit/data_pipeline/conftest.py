"""Session fixtures: the generated corpus, prepared once (in-process) for the prepare and loader
tests."""

from __future__ import annotations

import pytest
from corpus_helpers import Corpus, prepare_corpus, write_corpus

from data_pipeline.prepare import PrepareResult


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return write_corpus(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="session")
def prepared(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> PrepareResult:
    return prepare_corpus(corpus, tmp_path_factory.mktemp("prepared") / "dataset")
