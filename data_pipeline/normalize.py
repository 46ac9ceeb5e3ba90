"""Text normalization and document filters applied before deduplication.

Normalizing first means exact and near-duplicate detection compare what will be trained on,
so two copies that differ only in line endings or trailing spaces count as one document.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD")
WHITESPACE_MODES = ("none", "tidy", "collapse")

# Everything str.isspace() accepts except the ASCII ones: NBSP, ideographic space, the
# U+2000 block, line/paragraph separators... Shingling splits on ASCII whitespace only,
# so these would otherwise glue words together.
_UNICODE_SPACE = re.compile(r"[^\S \t\n\r\x0b\x0c]")
_TRAILING_SPACE = re.compile(r"[ \t\x0b\x0c]+$", re.MULTILINE)
_MANY_BLANK_LINES = re.compile(r"\n{3,}")
_ANY_SPACE_RUN = re.compile(r"\s+")


@dataclass(frozen=True)
class NormalizeConfig:
    """``tidy`` keeps indentation (code survives it); ``collapse`` folds every whitespace run
    into one space (web text)."""

    unicode_form: str | None = "NFC"
    whitespace: str = "tidy"

    def __post_init__(self) -> None:
        if self.unicode_form is not None and self.unicode_form not in UNICODE_FORMS:
            raise ValueError(f"unicode_form must be one of {UNICODE_FORMS} or None, "
                             f"got {self.unicode_form!r}")
        if self.whitespace not in WHITESPACE_MODES:
            raise ValueError(f"whitespace must be one of {WHITESPACE_MODES}, "
                             f"got {self.whitespace!r}")


@dataclass(frozen=True)
class FilterConfig:
    """Bounds on a normalized document: characters from below, UTF-8 bytes from above (the
    upper bound can then be checked on a file's size before reading it)."""

    min_chars: int = 20
    max_bytes: int = 2_000_000

    def __post_init__(self) -> None:
        if self.min_chars < 1:
            raise ValueError(f"min_chars must be >= 1, got {self.min_chars}")
        if self.max_bytes < self.min_chars:
            raise ValueError(f"max_bytes ({self.max_bytes}) must be >= min_chars "
                             f"({self.min_chars})")


def normalize(text: str, cfg: NormalizeConfig) -> str:
    if cfg.unicode_form is not None:
        text = unicodedata.normalize(cfg.unicode_form, text)
    if cfg.whitespace == "none":
        return text
    text = _UNICODE_SPACE.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    if cfg.whitespace == "collapse":
        return _ANY_SPACE_RUN.sub(" ", text).strip()
    text = _TRAILING_SPACE.sub("", text)
    return _MANY_BLANK_LINES.sub("\n\n", text).strip("\n")


def rejection(text: str, cfg: FilterConfig) -> str | None:
    """The reason a normalized document is dropped, or None to keep it."""
    if not text.strip():
        return "empty"
    if len(text) < cfg.min_chars:
        return "too_short"
    # Cheap bound first: UTF-8 needs at most 4 bytes per character.
    if len(text) * 4 > cfg.max_bytes and len(text.encode("utf-8")) > cfg.max_bytes:
        return "too_long"
    return None
