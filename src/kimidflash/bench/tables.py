"""The seed's three tables, as data (title, headers, rows, notes) that the
Markdown and terminal renderers both draw.

1. head-to-head: output tok/s of the baseline and each speculative series by
   concurrency, and the speedup *at the same concurrency*; a last row compares
   peaks (the seed's headline 5.6x is DFlash at 32 users over the baseline at 8).
2. per-user latency: users, mean latency, P95 latency, per-user tok/s.
3. per-position acceptance: rate at each draft position (vLLM's cumulative
   counters: drafts whose first i+1 tokens were accepted / drafts), the
   average acceptance, mean acceptance length and the net throughput effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lengths import by_prompt_length
from .series import Acceptance, Row, by_series_concurrency, pick_baseline, series_order, speedups

DASH = "—"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)  # right-aligned columns
    notes: list[str] = field(default_factory=list)


# --- formatting ---------------------------------------------------------------------------


def f_tps(v: float | None) -> str:
    return DASH if v is None else f"{v:,.1f} tok/s"


def f_s(v: float | None) -> str:
    if v is None:
        return DASH
    return f"{v:.1f}s" if v >= 10 else f"{v:.2f}s"


def f_x(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}x"


def f_pct(v: float | None, upper: float | None = None) -> str:
    if v is None:
        return f"<{upper * 100:.0f}%" if upper is not None else DASH
    return f"{v * 100:.1f}%"


def f_effect(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f}%"


# --- tables -------------------------------------------------------------------------------


def head_to_head(rows: list[Row], baseline: str | None = None) -> Table:
    base, cands = pick_baseline(rows, baseline)
    tps = by_series_concurrency(rows, "output_throughput")
    partial = {(r.series, r.concurrency) for r in rows if r.partial}
    concs = sorted({r.concurrency for r in rows if r.concurrency is not None})
    spec_cands = [c for c in cands if any(r.series == c and r.speculative for r in rows)] or cands
    headers = ["Concurrent users"]
    if base:
        headers.append(f"{base} (baseline)")
    headers += spec_cands
    if base:
        headers += ["Speedup" if len(spec_cands) == 1 else f"Speedup ({c})" for c in spec_cands]

    def cell(s: str, c: int) -> str:
        v = tps.get((s, c))
        return DASH if v is None else f_tps(v) + (" *" if (s, c) in partial else "")

    body: list[list[str]] = []
    for c in concs:
        line = [f"{c} users"]
        if base:
            line.append(cell(base, c))
        line += [cell(s, c) for s in spec_cands]
        if base:
            line += [f_x(speedups(rows, base, s).get(c)) for s in spec_cands]
        body.append(line)
    notes = ["Speedup compares series at the same concurrency only."]
    if base and spec_cands:

        def peak(s: str) -> tuple[float, int] | None:
            vals = [(v, c) for (ss, c), v in tps.items() if ss == s]
            return max(vals) if vals else None

        pb = peak(base)
        line = ["peak"]
        line.append(f"{f_tps(pb[0])} @{pb[1]}" if pb else DASH)
        ratios: list[str] = []
        for s in spec_cands:
            ps = peak(s)
            line.append(f"{f_tps(ps[0])} @{ps[1]}" if ps else DASH)
            ratios.append(f_x(ps[0] / pb[0]) if (ps and pb) else DASH)
        body.append(line + ratios)
        notes.append("The peak row compares each series' best throughput at whatever concurrency it reached.")
    if partial:
        notes.append("* from a partial run.")
    title = "Head-to-head: " + (" vs ".join(spec_cands + ([base] if base else [])))
    return Table(title, headers, body, right=set(range(1, len(headers))), notes=notes)


def per_user_latency(rows: list[Row]) -> Table:
    mean = by_series_concurrency(rows, "mean_latency_s")
    p95 = by_series_concurrency(rows, "p95_latency_s")
    pu = by_series_concurrency(rows, "per_user_tps")
    body: list[list[str]] = []
    # Speculative series first, as the seed shows its DFlash config.
    order = sorted(series_order(rows), key=lambda s: not any(r.series == s and r.speculative for r in rows))
    for s in order:
        for c in sorted({r.concurrency for r in rows if r.series == s and r.concurrency is not None}):
            if (s, c) not in mean and (s, c) not in pu:
                continue
            body.append(
                [
                    s,
                    str(c),
                    f_s(mean.get((s, c))),
                    f_s(p95.get((s, c))),
                    DASH if pu.get((s, c)) is None else f"{pu[(s, c)]:.1f}",
                ]
            )
    return Table(
        "Per-user latency",
        ["Series", "Concurrent users", "Mean latency", "P95 latency", "Per-user tok/s"],
        body,
        right={1, 2, 3, 4},
        notes=[
            "Latency is end to end per request, from when it was due (slot waits included); "
            "per-user tok/s is a session's output tokens over its time in requests."
        ],
    )


def per_position(acc: list[Acceptance], rows: list[Row], baseline: str | None = None) -> Table:
    width = max((len(a.rates) for a in acc), default=0)
    headers = (
        ["Series", "Spec tokens"]
        + [f"Pos {i}" for i in range(width)]
        + ["Avg acceptance", "Mean acceptance length", "Net effect"]
    )
    base, _ = pick_baseline(rows, baseline) if rows else (None, [])
    body: list[list[str]] = []
    for a in acc:
        cells = []
        for i in range(width):
            ub = a.upper_bounds[i] if i < len(a.upper_bounds) else None
            cells.append(f_pct(a.rates[i], ub) if i < len(a.rates) else DASH)
        effect = a.net_effect
        if effect is None:
            sp = speedups(rows, base, a.series)
            effect = ", ".join(f"{f_effect(v)} @{c}" for c, v in sorted(sp.items())) or DASH
        body.append(
            [
                a.series,
                DASH if a.num_speculative_tokens is None else str(a.num_speculative_tokens),
                *cells,
                f_pct(a.acceptance_rate),
                DASH if a.acceptance_length is None else f"{a.acceptance_length:.2f}",
                effect,
            ]
        )
    notes = [
        "Pos i: share of drafts whose first i+1 draft tokens were all accepted (vLLM's cumulative "
        "per-position counters over drafts). Net effect: throughput vs the baseline at the same concurrency."
    ]
    cond = [a for a in acc if a.conditional]
    for a in cond:
        notes.append(
            f"{a.series}: conditional acceptance by position (accepted at i given i-1 accepted): "
            + ", ".join(f_pct(x) for x in a.conditional)
        )
    return Table("Per-position acceptance", headers, body, right=set(range(1, len(headers) - 1)), notes=notes)


def per_prompt_length(rows: list[Row]) -> Table | None:
    """Acceptance per prompt-length bucket and series, every run of the series pooled, from the
    servers' per-request stats (SPEC_DECODE_METRICS); None where no run has them."""
    body: list[list[str]] = []
    for s in series_order(rows):
        pairs = [p for r in rows if r.series == s for p in r.request_spec]
        for b in by_prompt_length(list(pairs)) or []:
            rates = b["per_position_acceptance_rates"] or []
            body.append(
                [
                    s,
                    b["prompt_tokens"],
                    str(b["requests_with_stats"]),
                    DASH if b["num_spec_steps"] is None else f"{b['num_spec_steps']:.0f}",
                    DASH if b["acceptance_length"] is None else f"{b['acceptance_length']:.2f}",
                    ", ".join(f_pct(x) for x in rates) or DASH,
                ]
            )
    if not body:
        return None
    headers = ["Series", "Prompt tokens", "Requests", "Draft steps", "Mean acceptance length", "Per position"]
    notes = [
        "From each request's own spec-decode stats (vLLM --per-request-spec-decode-metrics, SPEC_DECODE_METRICS), "
        "by the request's prompt_tokens (the chat template and, in a session, earlier turns included); "
        "acceptance length 1 + accepted / draft steps."
    ]
    return Table("Acceptance by prompt length", headers, body, right={2, 3, 4}, notes=notes)
