"""The sweep's two charts: throughput against concurrency per server point, and
the Pareto front of per-user against total tok/s (the trade a deployment picks
from: each point on the front is the most total throughput for its per-user
speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bench.charts import pyplot, save


def throughput_chart(rows: list[dict[str, Any]], out: Path) -> Path | None:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["output_tps"] is not None:
            rest = "-".join(part for part in r["case"].split("-") if not part.startswith("c"))
            series.setdefault(r["point"] + (f" {rest}" if rest else ""), []).append((r["concurrency"], r["output_tps"]))
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series.items():
        pts.sort()
        ax.plot(
            [c for c, _ in pts], [v for _, v in pts], "--" if name.startswith("none") else "-", marker="o", label=name
        )
    return _finish(
        fig,
        ax,
        (
            "concurrent users",
            "output tok/s (aggregate, median of repeats)",
            "Throughput vs concurrency per server point",
        ),
        out,
    )


def pareto_chart(summary: dict[str, Any], out: Path) -> Path | None:
    rows = [r for r in summary["rows"] if r["per_user_tps"] is not None and r["output_tps"] is not None]
    if not rows:
        return None
    front = {tuple(p) for p in summary["pareto"]}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r["per_user_tps"] for r in rows], [r["output_tps"] for r in rows], color="0.6", label="point x case")
    on = sorted((r for r in rows if (r["point"], r["case"]) in front), key=lambda r: r["per_user_tps"])
    ax.plot([r["per_user_tps"] for r in on], [r["output_tps"] for r in on], "-o", color="C3", label="Pareto front")
    for r in on:
        ax.annotate(
            f"{r['point']} {r['case']}",
            (r["per_user_tps"], r["output_tps"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 4),
        )
    return _finish(
        fig, ax, ("output tok/s per user (mean)", "output tok/s (aggregate)", "Per-user against total throughput"), out
    )


def _finish(fig: Any, ax: Any, labels: tuple[str, str, str], out: Path) -> Path:
    xlabel, ylabel, title = labels
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out)
