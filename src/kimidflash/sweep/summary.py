"""The sweep's summary, from the run folder alone: one row per point and case
(medians over the repeats and their spread), the speedup over the same run's
baseline, the Pareto front of per-user against total tok/s, the best point
under the user's limits, and the advisor's predictions beside the measurement.

It is rebuilt from the files each time (also after an interrupted sweep, for
what is finished), so it never disagrees with the results it summarises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..fsio import utc_now
from ..paths import include_path, portable
from .grid import Case, Plan, Point, families
from .measured import Measured, measured
from .predict import compare
from .rundir import RunFolder
from .schedule import checks, describe, measured_schedule, predicted_schedule

# Result-file key of each figure the table shows (medians over the repeats).
FIGURES = {
    "output_tps": "output_throughput",
    "per_user_tps": "mean_per_user_output_throughput",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p95_ms": "p95_ttft_ms",
    "itl_p50_ms": "median_itl_ms",
    "itl_p95_ms": "p95_itl_ms",
    "latency_p50_ms": "median_e2el_ms",
    "latency_p95_ms": "p95_e2el_ms",
    "acceptance_length": "spec_decode_acceptance_length",
}


@dataclass(frozen=True)
class Limits:
    max_p95_latency_s: float | None = None
    min_user_tps: float | None = None

    def allows(self, row: dict[str, Any]) -> bool:
        if self.max_p95_latency_s is not None and not (row["latency_p95_ms"] or 0) / 1000 <= self.max_p95_latency_s:
            return False
        return self.min_user_tps is None or (row["per_user_tps"] or 0) >= self.min_user_tps

    def describe(self) -> str:
        parts = ([f"p95 latency <= {self.max_p95_latency_s:g} s"] if self.max_p95_latency_s is not None else []) + (
            [f"per-user tok/s >= {self.min_user_tps:g}"] if self.min_user_tps is not None else []
        )
        return ", ".join(parts) or "none"


def _round(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def row(m: Measured, base: Measured | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "point": m.point.id,
        "label": m.point.label,
        "overrides": m.point.sets,
        "case": m.case.id,
        "concurrency": m.case.concurrency,
        "repeats": len(m.docs),
    }
    out.update({name: _round(m.median(key)) for name, key in FIGURES.items()})
    out["output_tps_spread"] = _round(m.spread("output_throughput"))
    base_tps = base.median("output_throughput") if base else None
    out["speedup"] = _round(out["output_tps"] / base_tps, 4) if out["output_tps"] and base_tps else None
    return out


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows no other row beats on both per-user and total tok/s, by per-user tok/s."""
    pts = [r for r in rows if r["per_user_tps"] is not None and r["output_tps"] is not None]
    front = [
        r
        for r in pts
        if not any(
            o["per_user_tps"] >= r["per_user_tps"]
            and o["output_tps"] >= r["output_tps"]
            and (o["per_user_tps"], o["output_tps"]) != (r["per_user_tps"], r["output_tps"])
            for o in pts
        )
    ]
    return sorted(front, key=lambda r: r["per_user_tps"])


def best(rows: list[dict[str, Any]], limits: Limits) -> dict[str, Any] | None:
    ok = [r for r in rows if r["output_tps"] is not None and limits.allows(r)]
    return max(ok, key=lambda r: r["output_tps"]) if ok else None


def summarise(plan: Plan, folder: RunFolder, limits: Limits) -> dict[str, Any]:
    by_id = {p.id: p for p in plan.points}
    table: dict[tuple[str, str], Measured] = {}
    for p in plan.points:
        for c in plan.cases:
            m = measured(folder, p, c, plan.repeats)
            if m is not None:
                table[(p.id, c.id)] = m
    rows = [row(m, table.get((by_id[pid].baseline_id, cid))) for (pid, cid), m in table.items()]
    failed = {p.id: f for p in plan.points if (f := folder.failure(p))}
    advisor = [
        cmp
        for fam, pts in families(plan.points).items()
        for c in plan.cases
        if (cmp := compare(folder, fam, pts, c, table)) is not None
    ]
    incomplete = [f"{p.id} {c.id}" for p in plan.points for c in plan.cases if (p.id, c.id) not in table]
    schedules = [s for fam in families(plan.points) if (s := measured_schedule(plan, rows, fam)) is not None]
    for s in schedules:
        s["predicted"] = predicted_schedule(plan, advisor, s)
    return {
        "date": utc_now(),
        "base_config": portable(plan.base_config),
        "server_points": len(plan.points),
        "client_cases": len(plan.cases),
        "repeats": plan.repeats,
        "limits": limits.describe(),
        "rows": rows,
        "pareto": [(r["point"], r["case"]) for r in pareto(rows)],
        "best": best(rows, limits),
        "failed": failed,
        "incomplete": incomplete,
        "advisor": advisor,
        "schedules": schedules,
        "schedule": pick_schedule(schedules, rows),
        "schedule_checks": checks(plan, rows),
    }


def pick_schedule(schedules: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The schedule best.env takes: of the families with one, the one fastest at the lowest concurrency
    measured (where a drafter pays most)."""
    written = [s for s in schedules if "schedule" in s]
    if not written:
        return None
    low = min(r["concurrency"] for r in rows)
    return max(written, key=lambda s: next(d["output_tps"] for d in s["by_concurrency"] if d["concurrency"] == low))


def best_env(summary: dict[str, Any], plan: Plan, folder: RunFolder) -> dict[str, str]:
    """Env files serve.sh takes (INCLUDE= the base config, then the keys), by name: `best.env` is the
    measured draft schedule when the winners differ by concurrency, with the best static point beside
    it in `best-static.env`; otherwise the best static point is `best.env`. Empty: nothing qualifies."""
    b = summary["best"]
    if b is None:
        return {}
    point: Point = next(p for p in plan.points if p.id == b["point"])
    case: Case = next(c for c in plan.cases if c.id == b["case"])
    include = include_path(plan.base_config, folder.root)
    lat = b["latency_p95_ms"] / 1000 if b["latency_p95_ms"] is not None else float("nan")
    lines = [
        f"# The best point of the sweep in this folder (kimidflash sweep, {summary['date']}):",
        f"# {point.label}, measured at concurrency {case.concurrency} ({case.id}): {b['output_tps']} output tok/s,",
        f"# {b['per_user_tps']} tok/s per user, p95 latency {lat:.2f} s, {b['speedup']}x no speculation "
        f"(median of {b['repeats']} repeats).",
        f"# Limits: {summary['limits']}. Serve it with: ./serve.sh <this file>",
        f"INCLUDE={include}",
        *point.sets,
    ]
    static = "\n".join(lines) + "\n"
    s = summary.get("schedule")
    if s is None:
        return {"best.env": static}
    conc = " ".join(str(d["concurrency"]) for d in s["by_concurrency"])
    sched = [
        f"# The draft schedule this sweep measured (kimidflash sweep, {summary['date']}): at each concurrency",
        f"# the fastest of {s['family']}'s k and no speculation (median output tok/s of {summary['repeats']} repeats):",
        *describe(s),
        "# Batch sizes between two measured concurrencies take the k of the next one above; above the largest,",
        f"# its k carries to MAX_NUM_SEQS={s['max_num_seqs']}. The best static point is in best-static.env.",
        "# Serve it with: ./serve.sh <this file>. Measure it as one point against no speculation:",
        f"#   kimidflash sweep <this file> --concurrency {conc} --out <folder>",
        f"INCLUDE={include}",
        *s["sets"],
    ]
    return {"best.env": "\n".join(sched) + "\n", "best-static.env": static}


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


TABLE_COLUMNS = (
    ("point", "point", 0),
    ("case", "case", 0),
    ("output tok/s", "output_tps", 1),
    ("spread", "output_tps_spread", 3),
    ("speedup", "speedup", 3),
    ("tok/s/user", "per_user_tps", 2),
    ("TTFT p50/p95 ms", ("ttft_p50_ms", "ttft_p95_ms"), 0),
    ("ITL p50/p95 ms", ("itl_p50_ms", "itl_p95_ms"), 1),
    ("latency p50/p95 s", ("latency_p50_ms", "latency_p95_ms"), -1),
    ("acc. length", "acceptance_length", 2),
)


def cells(r: dict[str, Any]) -> list[str]:
    out = []
    for _, key, nd in TABLE_COLUMNS:
        if isinstance(key, tuple):
            a, b = (r[k] for k in key)
            if nd < 0:  # milliseconds shown as seconds
                a, b = (None if v is None else v / 1000 for v in (a, b))
                nd = 2
            out.append(f"{_fmt(a, nd)}/{_fmt(b, nd)}")
        else:
            out.append(_fmt(r[key], nd))
    return out
