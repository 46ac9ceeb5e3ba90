import dataclasses
import pydoc_data.topics

import pytest

from data_pipeline import (
    Document,
    corpus_fingerprint,
    embedded_corpus,
    load_embedded_corpus,
)
from data_pipeline.embedded import CODE_BUDGET_BYTES


@pytest.fixture(scope="module")
def corpus():
    return load_embedded_corpus()


def test_both_domains_present_with_nontrivial_sizes(corpus):
    code = [d for d in corpus.documents if d.domain == "code"]
    prose = [d for d in corpus.documents if d.domain == "prose"]
    assert len(code) + len(prose) == len(corpus.documents)
    code_bytes = sum(len(d.text.encode("utf-8")) for d in code)
    largest = max(len(d.text.encode("utf-8")) for d in code)
    # The budget is crossed by at most the last file taken.
    assert CODE_BUDGET_BYTES <= code_bytes < CODE_BUDGET_BYTES + largest
    assert len(prose) == len(pydoc_data.topics.topics) > 50
    assert sum(len(d.text) for d in prose) > 100_000


def test_order_and_source_ids(corpus):
    domains = [d.domain for d in corpus.documents]
    n_code = domains.count("code")
    assert domains == ["code"] * n_code + ["prose"] * (len(domains) - n_code)
    code_ids = [d.source_id for d in corpus.documents[:n_code]]
    prose_ids = [d.source_id for d in corpus.documents[n_code:]]
    assert code_ids == sorted(code_ids)
    assert all(s.startswith("stdlib:") and s.endswith(".py") for s in code_ids)
    assert prose_ids == [f"pydoc:{k}" for k in sorted(pydoc_data.topics.topics)]
    assert "stdlib:__future__.py" in code_ids


def test_excluded_paths_never_appear(corpus):
    for doc in corpus.documents:
        parts = doc.source_id.removeprefix("stdlib:").split("/")
        assert not {"test", "tests", "idlelib", "site-packages"} & set(parts[:-1])
        assert not parts[-1].startswith("_sysconfigdata_")
        assert not parts[0].startswith("config-")


def test_deterministic_documents_and_fingerprint(corpus):
    again = load_embedded_corpus()
    assert again.documents == corpus.documents
    assert again.fingerprint == corpus.fingerprint
    assert embedded_corpus() == list(corpus.documents)
    assert corpus_fingerprint(corpus.documents) == corpus.fingerprint
    assert len(corpus.fingerprint) == 64


def test_fingerprint_sensitive_to_content_and_field_boundaries():
    docs = [Document("code", "a", "xy"), Document("prose", "b", "z")]
    base = corpus_fingerprint(docs)
    assert corpus_fingerprint([Document("code", "a", "xY"), docs[1]]) != base
    assert corpus_fingerprint(docs[::-1]) != base
    # Same concatenated characters, different split between fields.
    assert corpus_fingerprint([Document("code", "ax", "y"), docs[1]]) != base


def test_document_is_frozen():
    doc = Document("code", "a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.text = "c"


def test_undecodable_files_are_skipped_and_counted(tmp_path):
    (tmp_path / "a.py").write_text("A = 1\n", encoding="utf-8")
    (tmp_path / "b.py").write_bytes(b"B = '\xff\xfe'\n")
    (tmp_path / "c.py").write_text("C = 'caf\u00e9'\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not python", encoding="utf-8")
    for excluded in ("test", "idlelib", "site-packages", "pkg/tests", "config-3.11-x"):
        (tmp_path / excluded).mkdir(parents=True)
        (tmp_path / excluded / "x.py").write_text("X = 1\n", encoding="utf-8")
    (tmp_path / "_sysconfigdata__linux.py").write_text("S = 1\n", encoding="utf-8")
    (tmp_path / "pkg" / "mod.py").write_text("M = 1\n", encoding="utf-8")

    result = load_embedded_corpus(stdlib_dir=tmp_path, code_budget_bytes=10**6)
    code_ids = [d.source_id for d in result.documents if d.domain == "code"]
    assert code_ids == ["stdlib:a.py", "stdlib:c.py", "stdlib:pkg/mod.py"]
    assert result.undecodable_files == 1
    assert result.documents[1].text == "C = 'caf\u00e9'\n"


def test_code_budget_stops_after_crossing_file(tmp_path):
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x" * 100, encoding="utf-8")
    result = load_embedded_corpus(stdlib_dir=tmp_path, code_budget_bytes=150)
    code_ids = [d.source_id for d in result.documents if d.domain == "code"]
    assert code_ids == ["stdlib:a.py", "stdlib:b.py"]
