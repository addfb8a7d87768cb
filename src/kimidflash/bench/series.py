"""Benchmark series: result files (ours and published ones) loaded into rows,
grouped by series and concurrency, and pooled per series.

The one model every output of `compare` reads (tables, Markdown, terminal,
charts), so none of them loads files or aggregates on its own. Published files
(`kimidflash-bench-published`) carry figures someone else measured; each row
keeps its source so no output passes them off as ours.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ReportError
from ..paths import portable
from .metrics import SpecDecodeStats, stats_from_counts
from .resultfile import SCHEMA_NAME, load_json, validate_result

PUBLISHED_SCHEMA = "kimidflash-bench-published"


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
    # per request: (prompt_tokens, vLLM's per-request spec-decode stats), where the server sent them
    request_spec: list[tuple[int | None, dict[str, Any]]] = field(default_factory=list)


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
        spec = stats_from_counts(
            doc["spec_decode_num_drafts"],
            doc.get("spec_decode_draft_tokens") or 0,
            doc.get("spec_decode_accepted_tokens") or 0,
            doc.get("spec_decode_per_position_accepted_counts") or [],
        )

    def ms(v: float | None) -> float | None:
        return None if v is None else v / 1000.0

    return Row(
        series=doc["label"],
        speculative=doc.get("speculative"),
        source="ours",
        file=path,
        concurrency=doc.get("max_concurrency"),
        output_throughput=_num(doc.get("output_throughput")),
        mean_latency_s=ms(_num(doc.get("mean_e2el_ms"))),
        p95_latency_s=ms(_num(doc.get("p95_e2el_ms"))),
        per_user_tps=_num(doc.get("mean_per_user_output_throughput")),
        spec=spec,
        partial=bool(doc.get("partial")),
        request_spec=[
            (q.get("prompt_tokens"), q["spec_decode"])
            for q in doc.get("requests") or []
            if isinstance(q, dict) and isinstance(q.get("spec_decode"), dict)
        ],
    )


def rows_from_published(doc: dict[str, Any], path: str) -> tuple[list[Row], list[Acceptance]]:
    src = f"{doc['source']} (measured by {doc['measured_by']}, not by us)"
    rows = [
        Row(
            series=r["series"],
            speculative=r.get("speculative"),
            source=src,
            file=path,
            concurrency=r["max_concurrency"],
            output_throughput=_num(r.get("output_throughput")),
            mean_latency_s=_num(r.get("mean_e2el_s")),
            p95_latency_s=_num(r.get("p95_e2el_s")),
            per_user_tps=_num(r.get("mean_per_user_output_throughput")),
        )
        for r in doc.get("runs", [])
    ]
    acc = [
        Acceptance(
            series=a["series"],
            source=src,
            num_speculative_tokens=a.get("num_speculative_tokens"),
            rates=[_num(x) for x in a["per_position_acceptance_rates"]],
            upper_bounds=[_num(x) for x in a.get("per_position_upper_bounds", [])],
            acceptance_rate=_num(a.get("acceptance_rate")),
            acceptance_length=_num(a.get("acceptance_length")),
            net_effect=a.get("net_effect"),
        )
        for a in doc.get("acceptance", []) or []
    ]
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
            sources.append(
                f"`{portable(path)}`: {doc['source']}; measured by {doc['measured_by']}, not by us. "
                f"Conditions: {_conditions(doc['conditions'])}"
            )
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
                f"`{portable(path)}`: ours, series '{doc['label']}', {doc['date']} UTC, "
                f"kimidflash {prov.get('tool_version')} "
                f"@ {rev}, model {prov.get('model')}, server vLLM {server.get('version')}, host "
                f"{(prov.get('host') or {}).get('hostname')}"
                + (f", recipe {recipe.get('path')} (sha256 {str(recipe.get('sha256'))[:12]})" if recipe else "")
                + (f", PARTIAL: {doc['partial_reason']}" if doc["partial"] else "")
            )
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


def series_order(rows: Iterable[Row]) -> list[str]:
    """Series names in the order the inputs first name them (tables and charts keep it)."""
    out: list[str] = []
    for r in rows:
        if r.series not in out:
            out.append(r.series)
    return out


def by_series_concurrency(rows: list[Row], attr: str) -> dict[tuple[str, int], float]:
    """Mean of `attr` over repeated runs of one series at one concurrency."""
    acc: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        v = getattr(r, attr)
        if v is not None and r.concurrency is not None:
            acc.setdefault((r.series, r.concurrency), []).append(v)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def pick_baseline(rows: list[Row], baseline: str | None) -> tuple[str | None, list[str]]:
    series = series_order(rows)
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
    for s in series_order(rows):
        pooled: SpecDecodeStats | None = None
        for r in rows:
            if r.series == s and r.spec is not None:
                pooled = r.spec if pooled is None else pooled.combined(r.spec)
        if pooled is None or not pooled.num_drafts:
            continue
        src = next(r.source for r in rows if r.series == s)
        out.append(
            Acceptance(
                series=s,
                source=src,
                num_speculative_tokens=pooled.num_speculative_tokens,
                rates=pooled.per_position_rates,
                acceptance_rate=pooled.acceptance_rate,
                acceptance_length=pooled.acceptance_length,
                conditional=pooled.conditional_rates,
            )
        )
    return out
