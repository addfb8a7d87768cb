"""Markdown output of `compare`: the tables, links to the charts and the sources."""

from __future__ import annotations

import os
from pathlib import Path

from ..mdtable import escape, table
from .tables import Table


def to_markdown(t: Table) -> str:
    rows = [[escape(c) for c in r] for r in t.rows] or [["(no data)"] + [""] * (len(t.headers) - 1)]
    lines = [f"### {t.title}", "", *table([escape(h) for h in t.headers], rows, t.right)]
    lines.append("")
    lines += [f"> {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


def render_markdown(tables: list[Table], sources: list[str], charts: list[Path], md_dir: Path | None) -> str:
    out = ["# Benchmark comparison", ""]
    for t in tables:
        out.append(to_markdown(t))
    if charts:
        out.append("### Charts\n")
        for c in charts:
            rel = os.path.relpath(c, md_dir) if md_dir else str(c)
            out.append(f"![{c.stem}]({rel})\n")
    out.append("### Sources\n")
    out += [f"- {s}" for s in sources]
    return "\n".join(out) + "\n"
