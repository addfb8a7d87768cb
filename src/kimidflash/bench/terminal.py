"""Terminal output (rich): one run's summary, and `compare`'s tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table as RTable

from .tables import Table


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def print_summary(doc: dict[str, Any]) -> None:
    """One run's figures on stderr (stdout stays free for whatever a caller pipes)."""

    def f(v: Any, nd: int = 1) -> str:
        return "—" if v is None else (f"{v:,.{nd}f}" if isinstance(v, float) else str(v))

    t = RTable(title=f"{doc['label']}{' (PARTIAL: ' + str(doc['partial_reason']) + ')' if doc['partial'] else ''}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("requests completed / failed / not started", f"{doc['completed']} / {doc['failed']} / {doc['not_started']}"),
        ("errors", ", ".join(f"{k}: {v}" for k, v in doc["errors"].items()) or "none"),
        ("concurrency", f(doc["max_concurrency"])),
        ("duration (s)", f(doc["duration"], 2)),
        ("output tokens", f(doc["total_output_tokens"])),
        ("output throughput (tok/s)", f(doc["output_throughput"])),
        ("per-user tok/s (mean)", f(doc["mean_per_user_output_throughput"])),
        ("TTFT ms mean / p95 / p99", f"{f(doc['mean_ttft_ms'])} / {f(doc['p95_ttft_ms'])} / {f(doc['p99_ttft_ms'])}"),
        ("TPOT ms mean", f(doc["mean_tpot_ms"], 2)),
        ("ITL ms mean / p99", f"{f(doc['mean_itl_ms'], 2)} / {f(doc['p99_itl_ms'], 2)}"),
        ("latency s mean / p95", f"{f(_s(doc['mean_e2el_ms']), 2)} / {f(_s(doc['p95_e2el_ms']), 2)}"),
        ("slot wait ms mean / p99", f"{f(doc['mean_slot_wait_ms'])} / {f(doc['p99_slot_wait_ms'])}"),
        ("token counts from", str(doc["token_source"])),
    ]
    if doc["spec_decode_num_drafts"] is not None:
        rates = doc["spec_decode_per_position_acceptance_rates"] or []
        rows += [
            ("acceptance rate", f(doc["spec_decode_acceptance_rate"], 3)),
            ("mean acceptance length", f(doc["spec_decode_acceptance_length"], 3)),
            ("per-position acceptance", " ".join(f(x, 3) for x in rates)),
        ]
    sm = doc["server_metrics"]
    if sm.get("available"):
        rows.append(
            (
                "server generation tokens (delta)",
                f"{f(sm.get('generation_tokens'), 0)} (match: {sm.get('output_tokens_match_server')})",
            )
        )
    elif sm.get("error"):
        rows.append(("/metrics", str(sm["error"])))
    for k, v in rows:
        t.add_row(k, v)
    Console(stderr=True).print(t)


def print_tables(tables: list[Table], sources: list[str]) -> None:
    """`compare`'s tables and sources on stdout."""
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
