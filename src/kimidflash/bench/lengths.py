"""Per-request spec-decode stats, pooled: over a run, and per prompt-length bucket.

vLLM's `--per-request-spec-decode-metrics summary` (SPEC_DECODE_METRICS) puts each request's own
counts in its reply's final usage chunk (`metrics.speculative_decoding`). Summed, they are an
independent check of the /metrics deltas; split by the request's prompt length, they say what
the acceptance does with context, which /metrics cannot: its counters are per server. Kimi K2.6
serves 256K-token contexts while the K2.5 drafter was trained on 4K, so the buckets run to 128K.

A request counts in the bucket of its own `prompt_tokens` (the usage figure: the chat template
included; in a multi-turn session, every earlier turn too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Upper edges (exclusive) of the prompt-length buckets, in tokens; the last bucket is open.
PROMPT_EDGES = (128, 512, 2048, 8192, 32768, 131072)


def pool(stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Requests' `speculative_decoding` dicts summed: steps, drafted and accepted tokens, the
    pooled acceptance rate and length, per-position rates from the summed histograms, and the
    per-request means. None for no stats."""
    if not stats:
        return None

    def total(key: str) -> float | None:
        vals = [d[key] for d in stats if isinstance(d.get(key), (int, float))]
        return float(sum(vals)) if len(vals) == len(stats) else None

    def avg(key: str) -> float | None:
        vals = [float(d[key]) for d in stats if isinstance(d.get(key), (int, float))]
        return round(sum(vals) / len(vals), 6) if vals else None

    steps, drafted, accepted = total("num_spec_steps"), total("num_draft_tokens"), total("num_accepted_draft_tokens")
    out: dict[str, Any] = {
        "requests_with_stats": len(stats),
        "num_spec_steps": steps,
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 6) if (accepted is not None and drafted) else None,
        "acceptance_length": round(1 + accepted / steps, 6) if (accepted is not None and steps) else None,
        "mean_request_acceptance_length": avg("mean_acceptance_length"),
        "mean_request_draft_acceptance_rate": avg("draft_acceptance_rate"),
        "per_position_acceptance_rates": None,
    }
    # acceptance_histogram[j]: steps with exactly j drafts accepted; position i is
    # reached by the steps with more than i accepted (vLLM's cumulative counts).
    hists = [d["acceptance_histogram"] for d in stats if isinstance(d.get("acceptance_histogram"), list)]
    if len(hists) == len(stats):
        width = max(len(h) for h in hists)
        pooled = [sum(h[j] for h in hists if j < len(h)) for j in range(width)]
        n_steps = sum(pooled)
        if n_steps:
            out["per_position_acceptance_rates"] = [round(sum(pooled[i + 1 :]) / n_steps, 6) for i in range(width - 1)]
    return out


@dataclass(frozen=True)
class Bucket:
    """Prompts of `low` to `high` tokens (`high` None: no upper bound)."""

    low: int
    high: int | None

    @property
    def label(self) -> str:
        def k(n: int) -> str:
            return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)

        return f"{k(self.low)}+" if self.high is None else f"{k(self.low)}-{k(self.high + 1)}"


BUCKETS = tuple(Bucket(lo, hi - 1) for lo, hi in zip((0, *PROMPT_EDGES[:-1]), PROMPT_EDGES, strict=True)) + (
    Bucket(PROMPT_EDGES[-1], None),
)


def bucket_of(prompt_tokens: int) -> Bucket:
    return next(b for b in BUCKETS if b.high is None or prompt_tokens <= b.high)


def by_prompt_length(pairs: list[tuple[int | None, dict[str, Any] | None]]) -> list[dict[str, Any]] | None:
    """(prompt_tokens, speculative_decoding) per request -> one pooled row per non-empty bucket,
    shortest first. Requests without stats or without a prompt length are left out; None when
    no request has both."""
    got = [(n, s) for n, s in pairs if isinstance(n, int) and s]
    if not got:
        return None
    rows = []
    for b in BUCKETS:
        stats = [s for n, s in got if bucket_of(n) == b]
        if stats:
            rows.append(
                {
                    "prompt_tokens": b.label,
                    "min_prompt_tokens": b.low,
                    "max_prompt_tokens": b.high,
                    **(pool(stats) or {}),
                }
            )
    return rows
