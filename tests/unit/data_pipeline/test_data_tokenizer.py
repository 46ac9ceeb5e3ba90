import pytest
from tokenizers import Tokenizer, models

from data_pipeline import (
    eod_id,
    load_embedded_corpus,
    load_tokenizer,
    train_bpe_tokenizer,
)
from data_pipeline.tokenizer import EOD_TOKEN

VOCAB = 512


@pytest.fixture(scope="module")
def documents():
    return load_embedded_corpus().documents


@pytest.fixture(scope="module")
def training_texts(documents):
    # A third of the corpus keeps training fast while covering both domains.
    return [d.text for d in documents[::3]]


@pytest.fixture(scope="module")
def tokenizer(training_texts):
    return train_bpe_tokenizer(training_texts, VOCAB)


def test_vocab_size_and_eod(tokenizer):
    assert tokenizer.get_vocab_size() == VOCAB
    assert eod_id(tokenizer) == tokenizer.token_to_id(EOD_TOKEN)
    assert tokenizer.encode(EOD_TOKEN).ids == [eod_id(tokenizer)]


def test_round_trip_code_and_prose(tokenizer, documents):
    code = next(d for d in documents if d.domain == "code")
    prose = next(d for d in documents if d.domain == "prose")
    for text in (code.text, prose.text):
        ids = tokenizer.encode(text).ids
        assert len(ids) < len(text)  # merges actually compress
        assert tokenizer.decode(ids) == text


def test_round_trip_unseen_characters(tokenizer):
    text = "  leading spaces, na\u00efve \u65e5\u672c\u8a9e \U0001f642\n\ttab\r\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_training_is_deterministic(tokenizer, training_texts):
    # Retrained from a one-shot iterator: the input form must not matter either.
    again = train_bpe_tokenizer(iter(training_texts), VOCAB)
    assert again.to_str() == tokenizer.to_str()


def test_save_and_load(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    loaded = load_tokenizer(path)
    text = "def f(x):\n    return x + 1\n"
    assert loaded.encode(text).ids == tokenizer.encode(text).ids
    assert loaded.to_str() == tokenizer.to_str()


def test_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(["abc"], 100)


def test_eod_id_requires_eod_token():
    with pytest.raises(ValueError, match="endoftext"):
        eod_id(Tokenizer(models.BPE()))
