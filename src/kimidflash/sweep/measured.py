"""One point at one client case, over its repeats: the figures the advisor and the
summary read, from the result files alone."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..bench.resultfile import load_result
from .grid import Case, Point
from .rundir import RunFolder


@dataclass
class Measured:
    point: Point
    case: Case
    docs: list[dict[str, Any]]

    def values(self, key: str) -> list[float]:
        return [float(d[key]) for d in self.docs if isinstance(d.get(key), (int, float))]

    def median(self, key: str) -> float | None:
        v = self.values(key)
        return statistics.median(v) if v else None

    def spread(self, key: str) -> float | None:
        """(max - min) / median across repeats (None for one repeat: no spread to show)."""
        v, m = self.values(key), self.median(key)
        return (max(v) - min(v)) / m if len(v) > 1 and m else None

    def profile(self) -> tuple[float, ...]:
        """Per-position acceptance pooled over the repeats (accepted counts over drafts,
        as vLLM counts it: cumulative)."""
        drafts = sum(d.get("spec_decode_num_drafts") or 0 for d in self.docs)
        counts = [d.get("spec_decode_per_position_accepted_counts") or [] for d in self.docs]
        width = max((len(c) for c in counts), default=0)
        if not drafts or not width:
            return ()
        return tuple(sum(c[i] for c in counts if i < len(c)) / drafts for i in range(width))


def measured(folder: RunFolder, point: Point, case: Case, repeats: int) -> Measured | None:
    """The point's results at this case, or None until every repeat is on disk."""
    paths = [folder.result_path(point, case, r) for r in range(1, repeats + 1)]
    if not all(p.is_file() for p in paths):
        return None
    return Measured(point, case, [load_result(p) for p in paths])
