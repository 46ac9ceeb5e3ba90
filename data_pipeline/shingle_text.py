"""What a shingle sees: the text as deduplication compares it, not as it is trained on.

Two copies that differ only in capitalization, punctuation, numbers or accents are the same
document to a reader, so before shingling (for signatures and for the exact verification alike)
each step below can be applied; all are on by default, as in the peers' MinHash pipelines:

- ``lowercase``: ``str.lower()``.
- ``punctuation``: every character of a Unicode punctuation category (``P*``) is removed, so
  ``"end."`` and ``"end"`` are one word and ``"well-known"`` becomes ``"wellknown"``.
- ``digits``: every run of decimal digits (any script) becomes ``0``, so ``"page 12"`` and
  ``"page 347"`` share their shingles; runs separated by ``.`` or ``,`` fold separately
  before punctuation removal joins them, which gives one ``0`` per run either way.
- ``unicode``: NFKD, then combining marks (category ``Mn``) removed: ``"café"`` -> ``"cafe"``,
  ligatures and full-width forms to their plain letters.

The training text itself is never changed by any of these.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

_DIGIT_RUN = re.compile(r"\d+")


@dataclass(frozen=True)
class ShingleNormalization:
    lowercase: bool = True
    punctuation: bool = True
    digits: bool = True
    unicode: bool = True

    @property
    def any(self) -> bool:
        return self.lowercase or self.punctuation or self.digits or self.unicode


@lru_cache(maxsize=1)
def _punctuation_table() -> dict[int, None]:
    # Built once per process (~0.3 s over every code point); str.translate then removes them.
    return {c: None for c in range(sys.maxunicode + 1)
            if unicodedata.category(chr(c)).startswith("P")}


def _strip_marks(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    if decomposed.isascii():
        return decomposed
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def shingle_view(text: str, cfg: ShingleNormalization) -> str:
    """The text that shingles are cut from."""
    if cfg.unicode and not text.isascii():
        text = _strip_marks(text)
    if cfg.lowercase:
        text = text.lower()
    if cfg.digits:
        text = _DIGIT_RUN.sub("0", text)
    if cfg.punctuation:
        text = text.translate(_punctuation_table())
    return text
