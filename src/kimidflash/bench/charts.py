"""PNG charts for `compare`: throughput, latency and acceptance by position.

matplotlib is imported lazily (with the non-interactive Agg backend) so a
benchmark run never needs it; a missing matplotlib is one clear error.
Series from published files are drawn dashed and labelled with "(published)",
so a chart never passes someone else's numbers off as ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ReportError
from .series import Acceptance, Row, by_series_concurrency, series_order


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("charts need matplotlib: pip install matplotlib (or pip install -e .[charts])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path) -> Path:
    """Lay out, write (its folder made if need be) and close one chart: every PNG here and in the sweep."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def _name(rows: list[Row], s: str) -> str:
    src = next((r.source for r in rows if r.series == s), "ours")
    return s if src == "ours" else f"{s} (published)"


def _style(rows: list[Row], s: str) -> str:
    return "-" if next((r.source for r in rows if r.series == s), "ours") == "ours" else "--"


def throughput_chart(rows: list[Row], out: Path) -> Path | None:
    tps = by_series_concurrency(rows, "output_throughput")
    if not tps:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in series_order(rows):
        pts = sorted((c, v) for (ss, c), v in tps.items() if ss == s)
        if pts:
            ax.plot([c for c, _ in pts], [v for _, v in pts], _style(rows, s), marker="o", label=_name(rows, s))
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("output tok/s (aggregate)")
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out)
    return out


def latency_chart(rows: list[Row], out: Path) -> Path | None:
    mean = by_series_concurrency(rows, "mean_latency_s")
    p95 = by_series_concurrency(rows, "p95_latency_s")
    if not mean and not p95:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in series_order(rows):
        for data, kind, marker in ((mean, "mean", "o"), (p95, "P95", "^")):
            pts = sorted((c, v) for (ss, c), v in data.items() if ss == s)
            if pts:
                ax.plot(
                    [c for c, _ in pts],
                    [v for _, v in pts],
                    _style(rows, s),
                    marker=marker,
                    label=f"{_name(rows, s)} {kind}",
                )
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("end-to-end latency (s)")
    ax.set_title("Latency vs concurrency")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, out)
    return out


def acceptance_chart(acc: list[Acceptance], out: Path) -> Path | None:
    acc = [a for a in acc if a.rates]
    if not acc:
        return None
    plt = pyplot()
    width = max(len(a.rates) for a in acc)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bar = 0.8 / len(acc)
    for j, a in enumerate(acc):
        xs = [i + (j - (len(acc) - 1) / 2) * bar for i in range(len(a.rates))]
        ys = []
        for i, r in enumerate(a.rates):
            ub = a.upper_bounds[i] if i < len(a.upper_bounds) else None
            ys.append(r if r is not None else (ub or 0.0))
        label = a.series if a.source == "ours" else f"{a.series} (published)"
        bars = ax.bar(
            xs, [y * 100 for y in ys], width=bar, label=label, hatch=None if a.source == "ours" else "//", alpha=0.85
        )
        for b, r in zip(bars, a.rates, strict=False):
            if r is None:
                b.set_alpha(0.3)  # an upper bound, not a value
    ax.set_xticks(range(width))
    ax.set_xticklabels([f"pos {i}" for i in range(width)])
    ax.set_ylabel("accepted (% of drafts)")
    ax.set_ylim(0, 100)
    ax.set_title("Acceptance by draft position")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, out)
    return out


def draw_all(rows: list[Row], acc: list[Acceptance], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = [
        throughput_chart(rows, folder / "throughput_vs_concurrency.png"),
        latency_chart(rows, folder / "latency_vs_concurrency.png"),
        acceptance_chart(acc, folder / "acceptance_by_position.png"),
    ]
    return [p for p in made if p is not None]
