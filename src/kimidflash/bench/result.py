"""The result file: one JSON document per run, with a stable, versioned schema.

Field names follow `vllm bench serve --save-result` where the meaning is the
same (total_output_tokens, output_throughput, mean/median/std/p99_ttft_ms,
tpot, itl, e2el, spec_decode_acceptance_rate, spec_decode_acceptance_length,
spec_decode_num_drafts, spec_decode_draft_tokens, spec_decode_accepted_tokens,
spec_decode_per_position_acceptance_rates), so the two tools' files can be
read side by side. Differences in meaning are named differently: our TTFT and
latency are measured from when a request was *due* (slot waits included), and
`slot_wait_ms` says how much of that was waiting.

The file's schema, validation and I/O are in resultfile.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import hostcpu, lengths, stats
from .client import RequestRecord, worse_source
from .metrics import (
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    Delta,
    SpecDecodeStats,
    shares,
    spec_decode_fields,
    spec_decode_stats,
)
from .resultfile import SCHEMA_NAME, SCHEMA_VERSION


@dataclass
class RunData:
    """Everything a run measured, in raw form; `build_result` turns it into the document."""

    config: dict[str, Any]
    provenance: dict[str, Any]
    label: str
    speculative: bool | None
    planned_requests: int
    records: list[RequestRecord]
    warmup: list[RequestRecord]
    t0: float | None  # perf_counter at the start of the measured window
    t_end: float | None
    start_utc: str | None
    metrics_urls: list[str] | None = None
    metrics_error: str | None = None
    metrics_delta: Delta | None = None  # a fleet's: its servers' deltas merged
    replica_deltas: dict[str, Delta] | None = None  # a fleet (several metrics URLs): each server's own
    replica_errors: dict[str, str] = field(default_factory=dict)
    spec: SpecDecodeStats | None = None
    partial: bool = False
    partial_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    client_cpu_seconds: float | None = None  # this process's CPU time inside the window
    server_cpu: tuple[hostcpu.Snapshot, hostcpu.Snapshot] | None = None  # the server's tree around the window


# Above this share of one core, the client's own work may be shaping the figures.
CLIENT_BUSY = 0.5


def client_busy_note(cpu_seconds: float | None, duration: float) -> str | None:
    """A note when the benchmark process itself was busy enough to matter: its
    asyncio loop is one core, and on a host it shares with the server its CPU is
    taken from the server's."""
    if cpu_seconds is None or duration <= 0 or cpu_seconds / duration <= CLIENT_BUSY:
        return None
    return (
        f"the benchmark client used {cpu_seconds / duration:.0%} of one core during the window; "
        "figures may be client-bound (run the client on cores the server does not use)"
    )


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def request_entry(rec: RequestRecord, t0: float) -> dict[str, Any]:
    chunk_sizes = [n for _, n in rec.chunks]
    return {
        "session": rec.session,
        "turn": rec.turn,
        "due_s": _r(rec.due - t0, 6),
        "slot_wait_ms": _r(None if rec.slot_wait is None else rec.slot_wait * 1000),
        "ttft_ms": _r(None if rec.ttft is None else rec.ttft * 1000),
        "e2el_ms": _r(None if rec.e2el is None else rec.e2el * 1000),
        "tpot_ms": _r(None if rec.tpot is None else rec.tpot * 1000),
        "prompt_tokens": rec.prompt_tokens,
        "output_tokens": rec.output_tokens,
        "token_source": rec.token_source or None,
        "chunks": len(chunk_sizes),
        "max_tokens_per_chunk": max(chunk_sizes) if chunk_sizes else None,
        "itl_ms": [round(x * 1000, 3) for x in rec.itls],
        "finish_reason": rec.finish_reason,
        "problem": rec.problem,
        "error": rec.error,
        "error_detail": rec.error_detail,
        "spec_decode": rec.spec_decode,
    }


def _structured(name: str | None, ok: list[RequestRecord]) -> dict[str, Any] | None:
    """A structured workload's replies: how many of the completed ones are what was asked, and why not
    (workloads.py); None for free text."""
    if name in (None, "free"):
        return None
    problems = [r.problem for r in ok if r.problem]
    kinds: dict[str, int] = {}
    for p in problems:
        kind = p.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"workload": name, "checked": len(ok), "valid": len(ok) - len(problems), "problems": kinds}


def _error_counts(records: list[RequestRecord]) -> dict[str, int]:
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return dict(sorted(errors.items()))


def _duration(run: RunData) -> float:
    return (run.t_end - run.t0) if (run.t0 is not None and run.t_end is not None) else 0.0


def _counts(run: RunData, ok: list[RequestRecord]) -> dict[str, Any]:
    """What ran and how much came back: requests, tokens, throughput, the client's CPU."""
    duration = _duration(run)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    worst = ""
    for r in ok:
        if r.token_source:
            worst = worse_source(worst, r.token_source)

    def rate(n: float) -> float | None:
        # no request completed: no throughput was measured (null, not 0.0)
        return _r(n / duration if duration > 0 and ok else None, 6)

    return {
        "max_concurrency": run.config.get("concurrency"),
        "num_sessions": run.config.get("sessions"),
        "turns_per_session": run.config.get("turns_per_session"),
        "num_prompts": run.planned_requests,
        "completed": len(ok),
        "failed": len(run.records) - len(ok),
        "not_started": run.planned_requests - len(run.records),
        "errors": _error_counts(run.records),
        "duration": _r(duration, 6),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(out_tokens),
        "total_token_throughput": rate(in_tokens + out_tokens),
        "token_source": worst or None,
        "client_cpu_seconds": _r(run.client_cpu_seconds, 6),
        "client_cpu_utilization": _r(
            run.client_cpu_seconds / duration if run.client_cpu_seconds is not None and duration > 0 else None, 3
        ),
    }


def _latency(ok: list[RequestRecord]) -> dict[str, Any]:
    """Distributions in `vllm bench serve` style: TTFT, TPOT, ITL, latency, slot
    waits, and output tokens per second per user (a session's tokens over its
    time in requests) and per request."""
    per_user: list[float] = []
    for s in sorted({r.session for r in ok}):
        mine = [r for r in ok if r.session == s]
        busy = sum(r.e2el or 0.0 for r in mine)
        if busy > 0:
            per_user.append(sum(r.output_tokens or 0 for r in mine) / busy)
    per_request_tps = [r.output_tokens / r.e2el for r in ok if r.e2el and r.output_tokens]
    out: dict[str, Any] = {}
    out.update(stats.summarize("ttft", "ms", [r.ttft for r in ok if r.ttft is not None], 1000))
    out.update(stats.summarize("tpot", "ms", [r.tpot for r in ok if r.tpot is not None], 1000))
    out.update(stats.summarize("itl", "ms", [x for r in ok for x in r.itls], 1000))
    out.update(stats.summarize("e2el", "ms", [r.e2el for r in ok if r.e2el is not None], 1000))
    out.update(stats.summarize("slot_wait", "ms", [r.slot_wait for r in ok if r.slot_wait is not None], 1000))
    out.update(stats.summarize("per_user_output_throughput", "", per_user))
    out.update(stats.summarize("per_request_output_throughput", "", per_request_tps))
    return out


def _server_metrics(run: RunData, out_tokens: int) -> dict[str, Any]:
    """The /metrics deltas of the window, and whether the server counted the
    tokens we did."""
    urls = run.metrics_urls or []
    server: dict[str, Any] = {
        "url": urls[0] if len(urls) == 1 else (urls or None),
        "available": run.metrics_delta is not None,
        "error": run.metrics_error,
    }
    if run.metrics_delta is not None:
        d = run.metrics_delta
        gen = d.total(GENERATION_TOKENS)
        server.update(
            {
                "window_seconds": _r(d.seconds, 3),
                "counter_resets": d.reset,
                "deltas": d.totals(),
                "generation_tokens": gen,
                "prompt_tokens": d.total(PROMPT_TOKENS),
                "output_tokens_match_server": None if gen is None else (gen == out_tokens),
            }
        )
    if len(urls) > 1:
        server["replicas"] = _replicas(run)
    return server


def _replicas(run: RunData) -> dict[str, dict[str, Any]]:
    """A fleet's servers: each one's tokens, share of the fleet's and acceptance, or why it dropped out."""
    deltas = run.replica_deltas or {}
    share = shares(deltas)
    out: dict[str, dict[str, Any]] = {}
    for url in run.metrics_urls or []:
        d = deltas.get(url)
        spec = spec_decode_stats(d) if d is not None else None
        out[url] = {
            "generation_tokens": d.total(GENERATION_TOKENS) if d is not None else None,
            "share": None if share.get(url) is None else _r(share[url], 4),
            "spec_decode_acceptance_length": None if spec is None else _r(spec.acceptance_length, 4),
            "error": run.replica_errors.get(url),
        }
    return out


def first_error(doc: dict[str, Any]) -> str | None:
    """The first failed request's error and its detail (`http_500 (boom)`); None
    when none failed (a cancellation is not a failure)."""
    for r in doc.get("requests") or []:
        if isinstance(r, dict) and r.get("error") and r.get("error") != "cancelled":
            return r["error"] + (f" ({r['error_detail']})" if r.get("error_detail") else "")
    return None


def no_completion(doc: dict[str, Any]) -> str | None:
    """For a run that was planned but got no request back: one line naming the
    first error (its figures are null, not a measurement; the command line exits
    3 on it and `validate` marks it). None when any request completed."""
    if doc.get("completed") != 0 or not doc.get("num_prompts"):
        return None
    first = first_error(doc)
    if first:
        return f"no request completed: {first}"
    return "no request completed: " + ("none was sent" if not doc.get("requests") else "every request was cancelled")


def build_result(run: RunData) -> dict[str, Any]:
    """The result document: identity, counts, latency, spec decode, server
    metrics, warm-up, notes and every request (the key order is the file's)."""
    ok = [r for r in run.records if r.ok]
    counts = _counts(run, ok)
    doc: dict[str, Any] = {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "partial": run.partial,
        "partial_reason": run.partial_reason,
        "label": run.label,
        "speculative": run.speculative,
        "date": run.start_utc,
        "provenance": run.provenance,
        "config": run.config,
        **counts,
        **_latency(ok),
        **spec_decode_fields(run.spec),
        "server_metrics": _server_metrics(run, counts["total_output_tokens"]),
        "server_cpu": hostcpu.summary(*run.server_cpu, _duration(run), counts["total_output_tokens"])
        if run.server_cpu
        else None,
        # vLLM's per-request stats (SPEC_DECODE_METRICS), pooled: a check of the /metrics deltas
        "per_request_spec_decode": lengths.pool([r.spec_decode for r in ok if r.spec_decode]),
        "per_request_spec_decode_by_prompt_length": lengths.by_prompt_length(
            [(r.prompt_tokens, r.spec_decode) for r in ok]
        ),
        "structured": _structured(run.config.get("workload"), ok),
        "warmup": {
            "requests": len(run.warmup),
            "completed": sum(1 for r in run.warmup if r.ok),
            "errors": _error_counts(run.warmup),
        },
    }
    busy = client_busy_note(run.client_cpu_seconds, _duration(run))
    doc["notes"] = run.notes + ([busy] if busy else [])
    t0 = run.t0 or 0.0
    doc["requests"] = [request_entry(r, t0) for r in sorted(run.records, key=lambda r: (r.due, r.session))]
    failure = no_completion(doc)
    if failure:
        doc["notes"].append(failure)
    return doc


def default_label(recipe: dict[str, Any] | None, speculative: bool | None, spec: SpecDecodeStats | None) -> str:
    """The series name when the user gave none: from the recipe config when the
    server was launched by it, else from what /metrics showed."""
    if recipe is not None:
        v = recipe["values"]
        if recipe["speculative"]:
            return f"{v.get('SPECULATIVE_METHOD')} k={v.get('NUM_SPECULATIVE_TOKENS')}"
        return "autoregressive"
    if speculative:
        k = spec.num_speculative_tokens if spec is not None else None
        return f"speculative k={k}" if k else "speculative"
    return "autoregressive" if speculative is False else "unlabelled"
