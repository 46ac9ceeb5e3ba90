"""Per-domain counts of what each stage did, rejected-document samples, and the summary table.

The invariant the summary shows: in = kept + exact duplicates + near duplicates + rejected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

_EXCERPT_CHARS = 200


@dataclass
class DomainCounts:
    records_in: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    exact_duplicates: int = 0
    near_duplicates: int = 0
    kept: int = 0
    tokens: int = 0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rejected"] = dict(sorted(self.rejected.items()))
        return out


@dataclass
class RejectLog:
    """The first ``per_reason`` rejections of each reason, with enough context to look them up;
    the counts themselves live in DomainCounts."""

    per_reason: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    _seen: dict[str, int] = field(default_factory=dict)

    def add(self, domain: str, source_id: str, location: str, reason: str, detail: str,
            text: str | None) -> None:
        seen = self._seen.get(reason, 0)
        self._seen[reason] = seen + 1
        if seen < self.per_reason:
            self.samples.append({
                "reason": reason, "domain": domain, "source_id": source_id,
                "location": location, "detail": detail,
                "excerpt": None if text is None else text[:_EXCERPT_CHARS],
            })


def summary_table(counts: dict[str, DomainCounts]) -> str:
    header = ("domain", "in", "kept", "exact dups", "near dups", "rejected", "tokens")
    rows = [(name, c.records_in, c.kept, c.exact_duplicates, c.near_duplicates,
             c.rejected_total, c.tokens) for name, c in sorted(counts.items())]
    totals = [sum(row[k] for row in rows) for k in range(1, len(header))]
    rows.append(("all", *totals))
    cells = [header, *[tuple(str(v) for v in row) for row in rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if k == 0 else cell.rjust(w)
                       for k, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    reasons: dict[str, int] = {}
    for c in counts.values():
        for reason, n in c.rejected.items():
            reasons[reason] = reasons.get(reason, 0) + n
    if reasons:
        lines.append("rejected: " + ", ".join(f"{r}={n}" for r, n in sorted(reasons.items())))
    return "\n".join(lines)
