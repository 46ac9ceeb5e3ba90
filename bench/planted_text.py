"""A corpus of real text made offline from what this machine has (the standard library's
sources, pydoc's topics, license texts, installed packages' documentation), with planted
near-duplicates whose true Jaccard is known; shared by bench/prepare_scale.py and
bench/dedup_peer.py.

Each document is a random draw of lines from that pool (so two documents share a few lines at
most); a fraction of them get a near copy: some words replaced by new ones, some edited on the
surface only (case, punctuation, accents, numbers), as ``data_pipeline.planted`` does. The true
Jaccard of every planted pair is the exact one in shingle view (``planted.exact_jaccard``).
"""

from __future__ import annotations

import glob
import json
import os
import string
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_pipeline.planted import exact_jaccard, surface_edit

_LETTERS = np.array(list(string.ascii_lowercase))


def line_pool(max_bytes: int = 40 << 20) -> list[str]:
    """Distinct non-blank lines of the offline sources, in a fixed order."""
    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
             "/usr/share/common-licenses", "/usr/share/doc"]
    seen: dict[str, None] = {}
    total = 0
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
            if not path.endswith((".py", ".md", ".rst", ".txt", "copyright")) and \
                    "common-licenses" not in path:
                continue
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for line in text.splitlines():
                line = line.strip()
                if len(line.split()) >= 3 and line not in seen:
                    seen[line] = None
                    total += len(line)
            if total >= max_bytes:
                return list(seen)
    return list(seen)


@dataclass(frozen=True)
class Planted:
    files: list[Path]
    documents: int
    bytes: int
    # (source id of the original, source id of the copy, true Jaccard)
    pairs: list[tuple[str, str, float]]


def _near_copy(text: str, rng: np.random.Generator) -> str:
    words = text.split(" ")
    target = rng.uniform(0.6, 0.99)
    k = max(1, round(len(words) * (1 - target) / (5 * (1 + target))))
    for pos in rng.choice(len(words), min(k, len(words)), replace=False).tolist():
        words[pos] = "".join(_LETTERS[rng.integers(0, 26, 12)])
    for pos in rng.choice(len(words), len(words) // 10, replace=False).tolist():
        words[pos] = surface_edit(words[pos], int(rng.integers(0, 4)), rng)
    return " ".join(words)


def write_corpus(out: Path, size_bytes: int, seed: int = 0, copy_fraction: float = 0.1,
                 file_bytes: int = 32 << 20, pool: list[str] | None = None) -> Planted:
    """``size_bytes`` of JSON lines in files of about ``file_bytes`` under ``out``."""
    rng = np.random.default_rng(seed)
    pool = pool if pool is not None else line_pool()
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    pairs = []
    written = docs = 0
    f = None
    size = 0
    line_no = 0
    while written < size_bytes:
        if f is None or size >= file_bytes:
            if f is not None:
                f.close()
            files.append(out / f"part-{len(files):05d}.jsonl")
            f = open(files[-1], "w", encoding="utf-8")
            size, line_no = 0, 0
        picks = rng.integers(0, len(pool), int(rng.integers(10, 60)))
        text = "\n".join(pool[i] for i in picks.tolist())
        batch = [text]
        if rng.random() < copy_fraction:
            batch.append(_near_copy(text, rng))
        ids = []
        for t in batch:
            source_id = f"{files[-1].name}:{line_no + 1}"
            row = json.dumps({"id": source_id, "text": t}, ensure_ascii=False) + "\n"
            f.write(row)
            line_no += 1
            size += len(row)
            written += len(row)
            docs += 1
            ids.append(source_id)
        if len(batch) == 2:
            pairs.append((ids[0], ids[1], exact_jaccard(batch[0], batch[1], 5)))
    if f is not None:
        f.close()
    return Planted(files, docs, written, pairs)


def quality(planted: Planted, removed: set[str]) -> dict[str, float]:
    """Recall: planted pairs at J >= t with one of the two removed; precision: removed
    documents that are the copy or the original of a planted pair at J >= 0.8 (the pool's
    lines make other true near-duplicates practically impossible)."""
    out: dict[str, float] = {}
    for t in (0.8, 0.85):
        at = [(a, b) for a, b, j in planted.pairs if j >= t]
        out[f"recall@{t}"] = sum(a in removed or b in removed for a, b in at) / max(len(at), 1)
        out[f"pairs@{t}"] = len(at)
    good = {x for a, b, j in planted.pairs if j >= 0.8 for x in (a, b)}
    out["precision"] = sum(r in good for r in removed) / max(len(removed), 1)
    out["removed"] = len(removed)
    return out
