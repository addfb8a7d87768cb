"""Summary statistics with one percentile definition used everywhere.

Percentiles interpolate linearly between order statistics (the definition
numpy uses by default), so our P50/P95/P99 are comparable with `vllm bench
serve`'s, without pulling numpy into the client.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

PERCENTILES: tuple[int, ...] = (50, 95, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) of `values`; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (rank - lo))


def mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def std(values: Sequence[float]) -> float | None:
    """Population standard deviation (as numpy.std), None when empty."""
    if not values:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def summarize(
    prefix: str, suffix: str, values: Iterable[float], scale: float = 1.0, ndigits: int = 3
) -> dict[str, float | None]:
    """`{mean_<p>_<s>, median_<p>_<s>, std_.., p95_.., p99_..}` in `vllm bench serve` style.

    `summarize("ttft", "ms", seconds, scale=1000)` gives mean_ttft_ms and friends.
    """
    xs = [v * scale for v in values]
    name = f"{prefix}_{suffix}" if suffix else prefix

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, ndigits)

    out: dict[str, float | None] = {
        f"mean_{name}": r(mean(xs)),
        f"median_{name}": r(percentile(xs, 50)),
        f"std_{name}": r(std(xs)),
    }
    for p in PERCENTILES:
        if p != 50:
            out[f"p{p}_{name}"] = r(percentile(xs, p))
    return out
