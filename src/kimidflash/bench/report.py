"""`compare`: the seed's three tables, in Markdown and on the terminal, plus charts.

Inputs are our result files and "published" files (figures transcribed from
someone else's report, e.g. the seed's MI300X numbers in benchmarks/seed/,
schema `kimidflash-bench-published`). Every table names where each series
comes from, so a published figure is never mistaken for one we measured.

Tables (as the seed shows them):
1. head-to-head: output tok/s of the baseline and each speculative series by
   concurrency, and the speedup *at the same concurrency*; a last row compares
   peaks (the seed's headline 5.6x is DFlash at 32 users over the baseline at 8).
2. per-user latency: users, mean latency, P95 latency, per-user tok/s.
3. per-position acceptance: rate at each draft position (vLLM's cumulative
   counters: drafts whose first i+1 tokens were accepted / drafts), the
   average acceptance, mean acceptance length and the net throughput effect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .metrics import SpecDecodeStats, stats_from_counts
from .result import SCHEMA_NAME, load_json, validate_result

PUBLISHED_SCHEMA = "kimidflash-bench-published"
DASH = "—"


class ReportError(ValueError):
    """Inputs compare cannot use; the message names the file or label."""


@dataclass
class Row:
    """One run at one concurrency, from our result file or a published one."""

    series: str
    speculative: bool | None
    source: str  # "ours" or a published source line
    file: str
    concurrency: int | None
    output_throughput: float | None = None
    mean_latency_s: float | None = None
    p95_latency_s: float | None = None
    per_user_tps: float | None = None
    spec: SpecDecodeStats | None = None
    partial: bool = False


@dataclass
class Acceptance:
    """Per-position acceptance of one series (pooled over its runs)."""

    series: str
    source: str
    num_speculative_tokens: int | None
    rates: list[float | None]
    upper_bounds: list[float | None] = field(default_factory=list)
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    net_effect: str | None = None
    conditional: list[float | None] = field(default_factory=list)


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)  # right-aligned columns
    notes: list[str] = field(default_factory=list)


@dataclass
class CompareReport:
    rows: list[Row]
    acceptance: list[Acceptance]
    tables: list[Table]
    sources: list[str]
    markdown: str
    charts: list[Path] = field(default_factory=list)


# --- loading ------------------------------------------------------------------------------

def validate_published(doc: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    if doc.get("schema") != PUBLISHED_SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {PUBLISHED_SCHEMA!r}")
    for key in ("source", "measured_by", "conditions"):
        if not doc.get(key):
            problems.append(f"missing {key}")
    if doc.get("measured_by_us") is not False:
        problems.append("a published file must say measured_by_us: false")
    runs = doc.get("runs", [])
    if not isinstance(runs, list):
        problems.append("runs must be a list")
        runs = []
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or not isinstance(r.get("series"), str):
            problems.append(f"runs[{i}] needs a series name")
            continue
        if not isinstance(r.get("max_concurrency"), int):
            problems.append(f"runs[{i}] needs an integer max_concurrency")
    for i, a in enumerate(doc.get("acceptance", []) or []):
        if not isinstance(a, dict) or not isinstance(a.get("per_position_acceptance_rates"), list):
            problems.append(f"acceptance[{i}] needs per_position_acceptance_rates")
    return problems


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def rows_from_result(doc: dict[str, Any], path: str) -> Row:
    spec = None
    if doc.get("spec_decode_num_drafts") is not None:
        spec = stats_from_counts(doc["spec_decode_num_drafts"], doc.get("spec_decode_draft_tokens") or 0,
                                 doc.get("spec_decode_accepted_tokens") or 0,
                                 doc.get("spec_decode_per_position_accepted_counts") or [])
    ms = (lambda v: None if v is None else v / 1000.0)
    return Row(series=doc["label"], speculative=doc.get("speculative"), source="ours", file=path,
               concurrency=doc.get("max_concurrency"), output_throughput=_num(doc.get("output_throughput")),
               mean_latency_s=ms(_num(doc.get("mean_e2el_ms"))), p95_latency_s=ms(_num(doc.get("p95_e2el_ms"))),
               per_user_tps=_num(doc.get("mean_per_user_output_throughput")), spec=spec,
               partial=bool(doc.get("partial")))


def rows_from_published(doc: dict[str, Any], path: str) -> tuple[list[Row], list[Acceptance]]:
    src = f"{doc['source']} (measured by {doc['measured_by']}, not by us)"
    rows = [Row(series=r["series"], speculative=r.get("speculative"), source=src, file=path,
                concurrency=r["max_concurrency"], output_throughput=_num(r.get("output_throughput")),
                mean_latency_s=_num(r.get("mean_e2el_s")), p95_latency_s=_num(r.get("p95_e2el_s")),
                per_user_tps=_num(r.get("mean_per_user_output_throughput")))
            for r in doc.get("runs", [])]
    acc = [Acceptance(series=a["series"], source=src, num_speculative_tokens=a.get("num_speculative_tokens"),
                      rates=[_num(x) for x in a["per_position_acceptance_rates"]],
                      upper_bounds=[_num(x) for x in a.get("per_position_upper_bounds", [])],
                      acceptance_rate=_num(a.get("acceptance_rate")),
                      acceptance_length=_num(a.get("acceptance_length")), net_effect=a.get("net_effect"))
           for a in doc.get("acceptance", []) or []]
    return rows, acc


def load_inputs(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Row], list[Acceptance], list[str]]:
    rows: list[Row] = []
    acc: list[Acceptance] = []
    sources: list[str] = []
    for p in paths:
        path = str(p)
        doc = load_json(path)
        if doc.get("schema") == PUBLISHED_SCHEMA:
            problems = validate_published(doc)
            if problems:
                raise ReportError(f"{path}: {problems[0]}")
            r, a = rows_from_published(doc, path)
            rows += r
            acc += a
            sources.append(f"`{path}`: {doc['source']}; measured by {doc['measured_by']}, not by us. "
                           f"Conditions: {_conditions(doc['conditions'])}")
        elif doc.get("schema") == SCHEMA_NAME:
            problems = validate_result(doc)
            if problems:
                raise ReportError(f"{path}: {problems[0]}")
            rows.append(rows_from_result(doc, path))
            prov = doc["provenance"]
            git = prov.get("git") or {}
            rev = (git.get("revision") or "unknown")[:12] + ("+dirty" if git.get("dirty") else "")
            server = prov.get("server") or {}
            recipe = prov.get("recipe_config") or {}
            sources.append(
                f"`{path}`: ours, series '{doc['label']}', {doc['date']} UTC, kimidflash {prov.get('tool_version')} "
                f"@ {rev}, model {prov.get('model')}, server vLLM {server.get('version')}, host "
                f"{(prov.get('host') or {}).get('hostname')}"
                + (f", recipe {recipe.get('path')} (sha256 {str(recipe.get('sha256'))[:12]})" if recipe else "")
                + (f", PARTIAL: {doc['partial_reason']}" if doc["partial"] else ""))
        else:
            raise ReportError(f"{path}: not a benchmark result (schema {doc.get('schema')!r})")
    if not rows and not acc:
        raise ReportError("no runs in the given files")
    return rows, acc, sources


def _conditions(c: Any) -> str:
    if isinstance(c, dict):
        return "; ".join(f"{k}: {v}" for k, v in c.items())
    return str(c)


# --- aggregation --------------------------------------------------------------------------

def _series_order(rows: Iterable[Row]) -> list[str]:
    out: list[str] = []
    for r in rows:
        if r.series not in out:
            out.append(r.series)
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def by_series_concurrency(rows: list[Row], attr: str) -> dict[tuple[str, int], float]:
    """Mean of `attr` over repeated runs of one series at one concurrency."""
    acc: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        v = getattr(r, attr)
        if v is not None and r.concurrency is not None:
            acc.setdefault((r.series, r.concurrency), []).append(v)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def pick_baseline(rows: list[Row], baseline: str | None) -> tuple[str | None, list[str]]:
    series = _series_order(rows)
    if baseline is not None:
        if baseline not in series:
            raise ReportError(f"--baseline {baseline!r} is not a series in the inputs ({', '.join(series)})")
        return baseline, [s for s in series if s != baseline]
    base = next((r.series for r in rows if r.speculative is False), None)
    return base, [s for s in series if s != base]


def speedups(rows: list[Row], base: str | None, cand: str) -> dict[int, float]:
    tps = by_series_concurrency(rows, "output_throughput")
    out: dict[int, float] = {}
    if base is None:
        return out
    for (s, c), v in tps.items():
        b = tps.get((base, c))
        if s == cand and b:
            out[c] = v / b
    return out


def acceptance_from_rows(rows: list[Row]) -> list[Acceptance]:
    out: list[Acceptance] = []
    for s in _series_order(rows):
        pooled: SpecDecodeStats | None = None
        for r in rows:
            if r.series == s and r.spec is not None:
                pooled = r.spec if pooled is None else pooled.combined(r.spec)
        if pooled is None or not pooled.num_drafts:
            continue
        src = next(r.source for r in rows if r.series == s)
        out.append(Acceptance(series=s, source=src, num_speculative_tokens=pooled.num_speculative_tokens,
                              rates=pooled.per_position_rates, acceptance_rate=pooled.acceptance_rate,
                              acceptance_length=pooled.acceptance_length, conditional=pooled.conditional_rates))
    return out


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
    order = sorted(_series_order(rows), key=lambda s: not any(r.series == s and r.speculative for r in rows))
    for s in order:
        for c in sorted({r.concurrency for r in rows if r.series == s and r.concurrency is not None}):
            if (s, c) not in mean and (s, c) not in pu:
                continue
            body.append([s, str(c), f_s(mean.get((s, c))), f_s(p95.get((s, c))),
                         DASH if pu.get((s, c)) is None else f"{pu[(s, c)]:.1f}"])
    return Table("Per-user latency", ["Series", "Concurrent users", "Mean latency", "P95 latency", "Per-user tok/s"],
                 body, right={1, 2, 3, 4},
                 notes=["Latency is end to end per request, from when it was due (slot waits included); "
                        "per-user tok/s is a session's output tokens over its time in requests."])


def per_position(acc: list[Acceptance], rows: list[Row], baseline: str | None = None) -> Table:
    width = max((len(a.rates) for a in acc), default=0)
    headers = ["Series", "Spec tokens"] + [f"Pos {i}" for i in range(width)] + \
              ["Avg acceptance", "Mean acceptance length", "Net effect"]
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
        body.append([a.series, DASH if a.num_speculative_tokens is None else str(a.num_speculative_tokens),
                     *cells, f_pct(a.acceptance_rate),
                     DASH if a.acceptance_length is None else f"{a.acceptance_length:.2f}", effect])
    notes = ["Pos i: share of drafts whose first i+1 draft tokens were all accepted (vLLM's cumulative "
             "per-position counters over drafts). Net effect: throughput vs the baseline at the same concurrency."]
    cond = [a for a in acc if a.conditional]
    for a in cond:
        notes.append(f"{a.series}: conditional acceptance by position (accepted at i given i-1 accepted): "
                     + ", ".join(f_pct(x) for x in a.conditional))
    return Table("Per-position acceptance", headers, body, right=set(range(1, len(headers) - 1)), notes=notes)


# --- rendering ----------------------------------------------------------------------------

def to_markdown(t: Table) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")
    lines = [f"### {t.title}", "", "| " + " | ".join(esc(h) for h in t.headers) + " |",
             "|" + "|".join("---:" if i in t.right else "---" for i in range(len(t.headers))) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in t.rows]
    if not t.rows:
        lines.append("| " + " | ".join(["(no data)"] + [""] * (len(t.headers) - 1)) + " |")
    lines.append("")
    lines += [f"> {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


def print_rich(tables: list[Table], sources: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table as RTable

    con = Console()
    if not con.is_terminal:
        con = Console(width=200)  # piped: do not squeeze the tables to 80 columns
    for t in tables:
        rt = RTable(title=t.title, caption="\n".join(t.notes), caption_justify="left")
        for i, h in enumerate(t.headers):
            rt.add_column(h, justify="right" if i in t.right else "left")
        for row in t.rows:
            rt.add_row(*row)
        con.print(rt)
    con.print("[bold]Sources[/bold]")
    for s in sources:
        con.print(f"- {s}", markup=False, highlight=False)


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


def compare(paths: Sequence[str | os.PathLike[str]], baseline: str | None = None,
            markdown: str | os.PathLike[str] | None = None, charts: str | os.PathLike[str] | None = None,
            terminal: bool = True) -> CompareReport:
    """Load result files, build the three tables, print/write them, draw charts."""
    rows, published_acc, sources = load_inputs(paths)
    acc = published_acc + acceptance_from_rows(rows)
    tables = [head_to_head(rows, baseline), per_user_latency(rows), per_position(acc, rows, baseline)]
    chart_paths: list[Path] = []
    if charts is not None:
        from .charts import draw_all
        chart_paths = draw_all(rows, acc, Path(charts))
    md_dir = Path(markdown).resolve().parent if markdown else None
    md = render_markdown(tables, sources, [p.resolve() for p in chart_paths] if md_dir else chart_paths, md_dir)
    if markdown:
        from ..fsio import write_text_atomic
        write_text_atomic(markdown, md)
    if terminal:
        print_rich(tables, sources)
    return CompareReport(rows, acc, tables, sources, md, chart_paths)
