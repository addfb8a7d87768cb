"""The summary written out: summary.json, summary.md, the terminal table, the
charts and best.env, all into the run folder (each file atomically)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..fsio import write_json_atomic, write_text_atomic
from ..mdtable import table
from .charts import pareto_chart, throughput_chart
from .grid import Plan
from .rundir import RunFolder
from .schedule import describe
from .summary import TABLE_COLUMNS, Limits, best_env, cells, summarise


def verdict(a: dict[str, Any]) -> str:
    """'' when the advisor picked the measured best; else whether the repeats could tell the two apart."""
    if a.get("agree"):
        return ""
    miss = a.get("miss")
    if miss and miss["within_spread"]:
        return (
            f" (a different choice, but the predicted one measured {miss['gap']:.1%} below it, within the "
            f"repeats' spread of {miss['spread']:.1%}: a tie these repeats do not resolve)"
        )
    return " (the prediction was wrong)" + (
        f": the predicted choice measured {miss['gap']:.1%} below it, "
        f"beyond the repeats' spread of {miss['spread']:.1%}"
        if miss
        else ""
    )


def advisor_lines(advisor: list[dict[str, Any]], level: str = "##") -> list[str]:
    out = [f"{level} The advisor: predicted before the other k ran, then measured", ""]
    for a in advisor:
        pred = a["prediction"]
        head = f"**{a['family']} at {a['case']}**, predicted from {pred['from_point']} (k={pred['k_run']})"
        if "error" in pred:
            out += [f"{head}: no prediction: {pred['error']}", ""]
            continue
        c = pred["cost"]
        out += [
            f"{head} over the baseline ({pred['measured_ratio']}x): step cost 1 + {c['draft']:g} + "
            f"{c['verify']:g}*k. Advisor: `{pred['line']}`. Measured best: "
            f"{'k=' + str(a['measured_best']) if a.get('measured_best') else 'no speculation'}"
            f"{verdict(a)}.",
            "",
        ]
        speedup = lambda v: "-" if v is None else f"{v:.3f}x"  # noqa: E731  one cell format
        out += table(
            ["k", "predicted speedup", "measured speedup", "error"],
            [
                [
                    b["k"],
                    speedup(b["predicted_speedup"]),
                    speedup(b["measured_speedup"]),
                    "-" if b["error"] is None else f"{b['error']:+.1%}",
                ]
                for b in a["by_k"]
            ],
        )
        if a.get("refit"):
            rc = a["refit"]["cost"]
            best = a["refit"]["best"]
            out += [
                "",
                f"Both costs fitted to every measured k: 1 + {rc['draft']:g} + {rc['verify']:g}*k, "
                f"best {'k=' + str(best) if best else 'no speculation'}.",
            ]
        out.append("")
    return out


def results_table(summary: dict[str, Any]) -> str:
    """The rows as Markdown, Pareto points marked, then the best point and what failed."""
    cols = [c for c, _, _ in TABLE_COLUMNS]
    front = {tuple(p) for p in summary["pareto"]}
    rows = []
    for r in summary["rows"]:
        c = cells(r)
        c[0] += " (Pareto)" if (r["point"], r["case"]) in front else ""
        rows.append(c)
    lines = table(cols, rows)
    b, s = summary["best"], summary.get("schedule")
    lines += [
        "",
        f"Best under the limits ({summary['limits']}): "
        + (
            f"**{b['point']}** at {b['case']}, {b['output_tps']} output tok/s -> "
            f"`{'best-static.env' if s else 'best.env'}`"
            if b
            else "none"
        ),
    ]
    if s and b:
        lines += [
            "",
            f"Draft schedule ({s['family']}: the fastest k or none at each concurrency) -> `best.env`: "
            f"`NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE={s['schedule']}`",
        ]
        lines += [line.lstrip("# ") for line in describe(s)]
        pred = s.get("predicted")
        if pred:
            lines += [
                "",
                f"The advisor's schedule, from each concurrency's largest k and baseline alone: "
                f"`{pred['schedule']}` ({'agrees' if pred['agree'] else 'differs'}: predicted "
                + ", ".join(f"c={d['concurrency']} k={d['predicted_k']}" for d in pred["by_concurrency"])
                + ")",
            ]
    for chk in summary.get("schedule_checks", []):
        lines += [
            "",
            f"Schedule point **{chk['point']}** against the better of no speculation and the fastest static point:",
            "",
            *table(
                ["concurrency", "tok/s", "best other", "its tok/s", "ratio"],
                [
                    [d["concurrency"], d["output_tps"], d["best_other"], d["best_other_tps"], f"{d['ratio']:.3f}"]
                    for d in chk["by_concurrency"]
                ],
            ),
        ]
    for other in summary.get("schedules", []):
        if "error" in other:
            lines += ["", f"No draft schedule for {other['family']}: {other['error']}"]
    for pid, f in summary["failed"].items():
        lines += ["", f"Point **{pid}** failed: {f['error']} (last log lines in `points/{pid}/failure.json`)"]
    if summary["incomplete"]:
        lines += ["", "Not measured (yet): " + ", ".join(summary["incomplete"])]
    return "\n".join(lines)


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Sweep summary ({summary['date']})",
        "",
        f"Base config `{summary['base_config']}`; {summary['server_points']} server points x "
        f"{summary['client_cases']} client "
        f"cases x {summary['repeats']} repeats. Figures are medians over the repeats; spread is (max - min) / "
        "median of output tok/s; speedup is against the same run's no-speculation point at the same case.",
        "",
        results_table(summary),
        "",
    ]
    if summary["advisor"]:
        lines += advisor_lines(summary["advisor"])
    return "\n".join(lines).rstrip() + "\n"


def print_table(summary: dict[str, Any], console: Console) -> None:
    t = Table(title=f"sweep: medians of {summary['repeats']} repeat(s); best under {summary['limits']}")
    for c, _, _ in TABLE_COLUMNS:
        t.add_column(c, justify="left" if c in ("point", "case") else "right")
    b = summary["best"]
    for r in summary["rows"]:
        style = "bold green" if b and (r["point"], r["case"]) == (b["point"], b["case"]) else None
        t.add_row(*cells(r), style=style)
    console.print(t)
    for a in summary["advisor"]:
        pred = a["prediction"]
        if "error" in pred:
            console.print(f"advisor {a['family']} {a['case']}: no prediction: {pred['error']}")
        elif "measured_best" in a:
            mb = f"k={a['measured_best']}" if a["measured_best"] else "none"
            console.print(
                f"advisor {a['family']} {a['case']}: predicted {pred['line'].split()[-1]}, "
                f"measured best {mb}{verdict(a)}",
                highlight=False,
            )


def write_summary(plan: Plan, folder: RunFolder, limits: Limits, console: Console | None = None) -> dict[str, Any]:
    summary = summarise(plan, folder, limits)
    root: Path = folder.root
    charts = [
        str(p.relative_to(root))
        for p in (
            throughput_chart(summary["rows"], root / "charts" / "throughput.png"),
            pareto_chart(summary, root / "charts" / "pareto.png"),
        )
        if p
    ]
    summary["charts"] = charts
    envs = best_env(summary, plan, folder)
    for name in ("best.env", "best-static.env"):
        if name in envs:
            write_text_atomic(root / name, envs[name])
        else:  # none qualifies now: an older file would name a point that no longer wins
            (root / name).unlink(missing_ok=True)
    if envs:
        summary["best_env"] = "best.env"
    write_json_atomic(root / "summary.json", summary)
    write_text_atomic(root / "summary.md", markdown(summary))
    if console is not None:
        print_table(summary, console)
    return summary
