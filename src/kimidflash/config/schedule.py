"""Which k a config drafts at each batch size, and what a measurement says it should: the
arithmetic a sweep's schedule (sweep/schedule.py) and the A/B's shipped check (bench/shipped.py)
share. Config-level and measurement-agnostic, so neither feature imports the other for it.
Why the rules are what they are (next-above between measured loads, ties within NEAR keep the
k) is in sweep/schedule.py's docstring, where the sweep that taught them is described.
"""

from __future__ import annotations

from typing import Any

from .model import SCHEDULE_KEY, Config, Schedule, draft_schedule, format_schedule

NEAR = 0.02  # a k this close to the fastest at a concurrency is a tie (3 repeats on 2 cores spread about this much)


def ranges(winners: list[tuple[int, int]], max_num_seqs: int) -> Schedule:
    """(concurrency, k) winners, sorted by concurrency, as inclusive batch-size ranges over
    1..max_num_seqs, neighbours with the same k merged."""
    out: list[tuple[int, int, int]] = []
    lo = 1
    for i, (c, k) in enumerate(winners):
        hi = max_num_seqs if i == len(winners) - 1 else min(c, max_num_seqs)
        if lo > hi:
            break
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], hi, k)
        else:
            out.append((lo, hi, k))
        lo = hi + 1
    return tuple(out)


def k_at(cfg: Config, batch: int) -> int:
    """The k a config drafts at this batch size: its schedule's, else its static k (0 without speculation)."""
    if cfg.speculative_method == "none":
        return 0
    for lo, hi, k in (
        draft_schedule(cfg.num_speculative_tokens_per_batch_size) if cfg.num_speculative_tokens_per_batch_size else ()
    ):
        if lo <= batch <= hi:
            return k
    return cfg.num_speculative_tokens


def fastest_k(rows: list[dict[str, Any]], shipped_k: int) -> int:
    """The k to serve at one concurrency from an interleaved check's rows there (one a category): each row's
    `candidates` ([k, tps] for no speculation, k=0, and the config's drafter at each static k measured) and
    `as_shipped_tps` (the config as shipped, drafting `shipped_k` at this batch size). A candidate scores
    its worst share of the fastest across the categories; the shipped k stays while it scores within NEAR
    of the best (a switch on a tie follows the noise)."""
    per_row, shipped = [], 1.0
    for r in rows:
        tps = [(int(k), t) for k, t in r["candidates"] if t] + [(shipped_k, r["as_shipped_tps"])]
        top = max(t for _, t in tps)
        shipped = min(shipped, r["as_shipped_tps"] / top)
        shares: dict[int, float] = {}
        for k, t in tps:  # the shipped k's share is the better of as shipped and its static run
            shares[k] = max(shares.get(k, 0.0), t / top)
        per_row.append(shares)
    scores = {k: min(s.get(k, 0.0) for s in per_row) for k in per_row[0]}
    best = max(scores, key=lambda k: (scores[k], -k))  # a tie goes to the smaller k
    return shipped_k if shipped >= scores[best] * (1 - NEAR) else best


def checked_schedule(cfg: Config, best: dict[int, int]) -> dict[str, Any] | None:
    """The config with the k an interleaved check measured fastest (`best`: concurrency -> k), spread over
    the batch sizes as a sweep's schedule is (`ranges`): those between two measured concurrencies take the
    k of the next one above, those above the largest its k; those below the smallest keep the shipped k
    (nothing measured there). So a check also corrects a schedule that drafts more between two measured
    loads than the load above it does. None when that changes nothing: where the config drafts nothing
    and still loses to no speculation, what it lost is a k=0 step's cost, which no schedule removes."""
    if cfg.speculative_method == "none":
        return None
    top = cfg.max_num_seqs
    shipped = [k_at(cfg, b) for b in range(1, top + 1)]
    measured = sorted(c for c in best if c <= top)
    if not measured:
        return None
    ks = list(shipped)
    for lo, hi, k in ranges([(c, best[c]) for c in measured], top):
        lo = max(lo, measured[0])  # below the smallest measured: as shipped
        ks[lo - 1 : hi] = [k] * (hi - lo + 1)
    if ks == shipped:
        return None
    out: dict[str, Any] = {
        "changed_at": [c for c in measured if best[c] != shipped[c - 1]],
        "between": [b for b in range(1, top + 1) if ks[b - 1] != shipped[b - 1] and b not in measured],
        "by_concurrency": [{"concurrency": c, "shipped_k": shipped[c - 1], "k": ks[c - 1]} for c in measured],
    }
    if not any(ks):
        return {**out, "schedule": None, "serves": "no speculation", "sets": ["SPECULATIVE_METHOD=none"]}
    if len(set(ks)) == 1:
        return {
            **out,
            "schedule": None,
            "serves": f"static k={ks[0]}",
            "sets": [f"NUM_SPECULATIVE_TOKENS={ks[0]}", f"{SCHEDULE_KEY}="],
        }
    sched = format_schedule(ranges(list(enumerate(ks, 1)), top))
    return {
        **out,
        "schedule": sched,
        "serves": f"the schedule {sched}",
        "sets": [f"NUM_SPECULATIVE_TOKENS={max(ks)}", f"{SCHEDULE_KEY}={sched}"],
    }
