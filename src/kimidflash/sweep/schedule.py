"""The per-batch-size draft schedule a sweep measured: at each concurrency, the
fastest of a drafter family's k (DFlash or EAGLE-3) and no speculation, as NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE.

A static k that pays at one user can lose under load (the committed CPU sweep:
1.26x at c=1, 0.56x at c=8 for k=3), so one k written into best.env is wrong at
some load the sweep measured. vLLM picks k per step from the running batch
size; the schedule gives it the measured winner at each concurrency.

Batch sizes between two measured concurrencies take the k of the next one
above (the more cautious guess: k falls with load); above the largest, its k
carries up to MAX_NUM_SEQS. Where the k that won the concurrency below is
within 2% of the fastest, it carries on: a schedule that switches k on a tie
follows the noise (the first CPU sweep with k=1, 2, 3 picked k=2 at two users
by 0.9% and k=3 at one and four). The schedule is written only when the winners
differ; when one k (or no speculation) wins everywhere, that static point is
the answer. The user's latency limits pick the best static point, not the
schedule: at one concurrency the faster setting is also the one with the
lower latency.
"""

from __future__ import annotations

from typing import Any

from ..backends import DRAFT_MODEL_METHODS
from ..config import SCHEDULE_KEY, format_schedule, load_config
from ..config.schedule import NEAR, ranges
from .grid import Plan, Point, families


def _family_rows(rows: list[dict[str, Any]], pts: list[Point]) -> dict[int, list[tuple[int, dict[str, Any]]]]:
    """Per concurrency: (k, row) for the baseline (k=0) and each k of the family."""
    ks = {pts[0].baseline_id: 0, **{p.id: p.k or 0 for p in pts}}
    out: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for r in rows:
        if r["point"] in ks and r["output_tps"] is not None:
            out.setdefault(r["concurrency"], []).append((ks[r["point"]], r))
    return out


def measured_schedule(plan: Plan, rows: list[dict[str, Any]], family: str | None) -> dict[str, Any] | None:
    """The schedule of `family` (a family of the plan that drafts with a model: DFlash or EAGLE-3, the
    methods vLLM's per-batch-size list serves) from the summary's rows, or why there is none. None when
    the family is not one a schedule applies to."""
    fams = families(plan.points)
    if family not in fams:
        return None
    pts = fams[family]
    cfg = load_config(plan.base_config, dict(pts[-1].overrides))
    method = cfg.speculative_method
    if method not in DRAFT_MODEL_METHODS or cfg.num_speculative_tokens_per_batch_size:
        return None  # no draft model (ngram), or a schedule measured as a point: nothing to derive
    if len({c.concurrency for c in plan.cases}) != len(plan.cases):
        return {
            "family": family,
            "error": "the client cases vary more than concurrency, so no one k per "
            "concurrency can be read; sweep one prompt set, length and session count",
        }
    by_c = _family_rows(rows, pts)
    missing = sorted(
        c.concurrency
        for c in plan.cases
        if not any(k == 0 for k, _ in by_c.get(c.concurrency, [])) or not any(k for k, _ in by_c.get(c.concurrency, []))
    )
    if missing:
        return {
            "family": family,
            "error": f"no baseline and k measured at concurrency {', '.join(map(str, missing))} yet",
        }
    winners: list[tuple[int, int]] = []
    detail: list[dict[str, Any]] = []
    for c in sorted(by_c):
        k, r = max(by_c[c], key=lambda kr: (kr[1]["output_tps"], -kr[0]))  # a tie goes to the smaller k
        held = [kr for kr in by_c[c] if winners and kr[0] == winners[-1][1]]
        if held and held[0][1]["output_tps"] >= r["output_tps"] * (1 - NEAR):
            k, r = held[0]  # within the noise of the fastest: the k below carries on, one range fewer
        base = next(row for kk, row in by_c[c] if kk == 0)
        winners.append((c, k))
        detail.append(
            {
                "concurrency": c,
                "k": k,
                "point": r["point"],
                "output_tps": r["output_tps"],
                "speedup": round(r["output_tps"] / base["output_tps"], 4) if base["output_tps"] else None,
            }
        )
    top = max(k for _, k in winners)
    out: dict[str, Any] = {"family": family, "by_concurrency": detail, "max_num_seqs": cfg.max_num_seqs}
    if len({k for _, k in winners}) == 1:
        return {**out, "static": top}  # one answer everywhere: no schedule needed
    sched = ranges(winners, cfg.max_num_seqs)
    rest = [
        f"{k}={v}"
        for k, v in pts[-1].overrides
        if k not in ("NUM_SPECULATIVE_TOKENS", "SPECULATIVE_METHOD", SCHEDULE_KEY)
    ]
    sets = [
        f"SPECULATIVE_METHOD={method}",
        *rest,
        f"NUM_SPECULATIVE_TOKENS={top}",
        f"{SCHEDULE_KEY}={format_schedule(sched)}",
    ]
    load_config(plan.base_config, sets)  # the rules accept what is written
    return {**out, "schedule": format_schedule(sched), "num_speculative_tokens": top, "sets": sets}


def predicted_schedule(plan: Plan, advisor: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any] | None:
    """The advisor's schedule for the measured one's family: at each concurrency the k it predicted from the
    family's largest k and the baseline alone (no speculation when it predicted none), beside the measured k."""
    by_case = {c.id: c.concurrency for c in plan.cases}
    preds = {
        by_case[a["case"]]: a["prediction"].get("recommended_k") or 0
        for a in advisor
        if a["family"] == measured["family"] and "error" not in a["prediction"]
    }
    if not preds or "by_concurrency" not in measured:
        return None
    per_c = [
        {"concurrency": d["concurrency"], "measured_k": d["k"], "predicted_k": preds.get(d["concurrency"])}
        for d in measured["by_concurrency"]
    ]
    if any(d["predicted_k"] is None for d in per_c):
        return None
    sched = ranges([(d["concurrency"], d["predicted_k"]) for d in per_c], measured["max_num_seqs"])
    return {
        "schedule": format_schedule(sched),
        "by_concurrency": per_c,
        "agree": all(d["measured_k"] == d["predicted_k"] for d in per_c),
    }


def checks(plan: Plan, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every schedule measured as a point ([[point]] in a grid file, or a sweep of a best.env), at each
    concurrency against the better of no speculation and the fastest static point beside it (same
    baseline, no schedule): the schedule holds where that ratio is 1 or more."""
    sched = {
        p.id
        for p in plan.points
        if p.speculative and load_config(plan.base_config, dict(p.overrides)).num_speculative_tokens_per_batch_size
    }
    by_point = {p.id: p for p in plan.points}
    out = []
    for pid in sorted(sched):
        per_c = []
        for r in sorted((r for r in rows if r["point"] == pid and r["output_tps"]), key=lambda r: r["concurrency"]):
            others = [
                o
                for o in rows
                if o["case"] == r["case"]
                and o["output_tps"]
                and o["point"] not in sched
                and by_point[o["point"]].baseline_id == by_point[pid].baseline_id
            ]
            if not others:
                continue
            o = max(others, key=lambda o: o["output_tps"])
            per_c.append(
                {
                    "concurrency": r["concurrency"],
                    "output_tps": r["output_tps"],
                    "best_other": o["point"],
                    "best_other_tps": o["output_tps"],
                    "ratio": round(r["output_tps"] / o["output_tps"], 4),
                }
            )
        out.append({"point": pid, "by_concurrency": per_c})
    return out


def describe(s: dict[str, Any]) -> list[str]:
    """The per-concurrency winners as comment lines."""
    parts = [
        f"c={d['concurrency']}: {'k=' + str(d['k']) if d['k'] else 'no speculation'} "
        f"({d['output_tps']} tok/s, {d['speedup']}x)"
        for d in s["by_concurrency"]
    ]
    return [f"#   {'; '.join(parts)}"]
