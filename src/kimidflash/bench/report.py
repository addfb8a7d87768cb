"""`compare`: result files in, the seed's three tables out (terminal and
Markdown), plus charts.

Inputs are our result files and "published" files (figures transcribed from
someone else's report, e.g. the seed's MI300X numbers in benchmarks/seed/,
schema `kimidflash-bench-published`). Every table names where each series
comes from, so a published figure is never mistaken for one we measured.

This module only wires the pieces together: `series` loads and aggregates,
`tables` builds the tables, `markdown`, `terminal` and `charts` each draw one
output format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..fsio import write_text_atomic
from .charts import draw_all
from .markdown import render_markdown
from .series import Acceptance, Row, acceptance_from_rows, load_inputs
from .tables import Table, head_to_head, per_position, per_prompt_length, per_user_latency
from .terminal import print_tables


@dataclass
class CompareReport:
    rows: list[Row]
    acceptance: list[Acceptance]
    tables: list[Table]
    sources: list[str]
    markdown: str
    charts: list[Path] = field(default_factory=list)


def compare(
    paths: Sequence[str | os.PathLike[str]],
    baseline: str | None = None,
    markdown: str | os.PathLike[str] | None = None,
    charts: str | os.PathLike[str] | None = None,
    terminal: bool = True,
) -> CompareReport:
    """Load result files, build the three tables (and acceptance by prompt length where the servers sent
    per-request stats), print/write them, draw charts."""
    rows, published_acc, sources = load_inputs(paths)
    acc = published_acc + acceptance_from_rows(rows)
    tables = [head_to_head(rows, baseline), per_user_latency(rows), per_position(acc, rows, baseline)]
    by_length = per_prompt_length(rows)
    if by_length is not None:
        tables.append(by_length)
    chart_paths = draw_all(rows, acc, Path(charts)) if charts is not None else []
    md_dir = Path(markdown).resolve().parent if markdown else None
    md = render_markdown(tables, sources, [p.resolve() for p in chart_paths] if md_dir else chart_paths, md_dir)
    if markdown:
        write_text_atomic(markdown, md)
    if terminal:
        print_tables(tables, sources)
    return CompareReport(rows, acc, tables, sources, md, chart_paths)
