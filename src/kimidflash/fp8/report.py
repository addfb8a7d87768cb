"""The FP8 validation report as markdown, from the validation document alone.

Why only from the document: the JSON is the record, the markdown a view of it, so
a report can be re-rendered from a committed ``validation.json`` and never says
anything the JSON does not hold. How to read it: docs/fp8-kv.md.
"""

from __future__ import annotations

from typing import Any

from ..mdtable import escape, table


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _cell(s: Any, limit: int = 60) -> str:
    text = escape(str(s).replace("\n", " "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(doc: dict[str, Any]) -> str:
    """report.md: one section per function, in reading order."""
    sections = (_summary, _servers, _agreement, _throughput, _per_prompt, _provenance)
    return "\n".join(line for section in sections for line in section(doc))


def _summary(doc: dict[str, Any]) -> list[str]:
    s = doc["settings"]
    return [
        "# FP8 KV validation",
        "",
        f"**{'PASS' if doc['passed'] else 'FAIL'}**" + ("" if doc["passed"] else ": " + "; ".join(doc["reasons"])),
        "",
        f"Gate: {s['gate']} (min_agreement {s['min_agreement']:g}).",
        f"{s['prompts']} shipped validation prompts, greedy (temperature 0), at most {s['max_tokens']} tokens each; "
        f"teacher-forced scoring with the top {s['top_k']} prompt logprobs per position.",
        "",
    ]


def _servers(doc: dict[str, Any]) -> list[str]:
    lines = [
        "## Servers",
        "",
        "The reference serves KV_CACHE_DTYPE=auto: its KV cache keeps the model's dtype (BF16 in production, "
        "float32 in the CPU reference).",
        "",
    ]
    rows = []
    for label, srv in doc["servers"].items():
        over = " ".join(f"{k}={v}" for k, v in srv["overrides"].items())
        tokens = srv.get("kv_cache_tokens")
        rows.append(
            [
                label,
                f"`{_cell(over, 200)}`",
                _cell(srv["vllm_kv_log"] or "none (model dtype)", 50),
                f"{tokens:,}" if tokens else "not logged",
                f"{srv['ready_after_s']} s",
            ]
        )
    lines += table(
        ["server", "overrides", "vLLM KV cache log", "KV cache tokens (vLLM's log)", "ready after"], rows, {3}
    )
    scales = doc.get("fp8_checkpoint_scales")
    return lines + [
        "",
        f"FP8 server's checkpoint KV scales: {scales['summary'] if scales else 'none (vLLM uses 1.0)'}.",
        "",
    ]


def _agreement(doc: dict[str, Any]) -> list[str]:
    s, tok, tf = doc["settings"], doc["token_agreement"], doc["teacher_forced"]
    return [
        "## Agreement",
        "",
        *table(
            ["measure", "value"],
            [
                [
                    "prompts with identical greedy outputs",
                    f"{tok['identical']} / {s['prompts']} ({tok['identical_share']:.1%})",
                ],
                ["mean matched prefix (common prefix / longer output)", f"{tok['mean_matched_prefix']:.3f}"],
                ["teacher-forced positions", tf["positions"]],
                ["teacher-forced top-1 agreement", f"{tf['top1_agreement']:.4f}"],
                [
                    "KL(reference ‖ fp8) per token, mean / p99 / max (nats, lower bound)",
                    f"{tf['mean_kl']:.2e} / {tf['p99_kl']:.2e} / {tf['max_kl']:.2e}",
                ],
                ["reference mass outside the shared top-k tokens (mean)", f"{tf['mean_uncovered']:.2e}"],
                ["reference's own top-1 equals its greedy token", _f(tf["reference_self_top1"], ".4f")],
            ],
        ),
        "",
        f"KL: {tf['kl']}; the less mass outside the shared tokens, the tighter the bound.",
        "",
    ]


def _throughput(doc: dict[str, Any]) -> list[str]:
    tp = doc["throughput"]
    return [
        "## Throughput (kimidflash.bench, short run)",
        "",
        *table(
            ["server", "output tok/s", "speculative acceptance length"],
            [
                [
                    "auto-kv (reference)",
                    _f(tp["reference_output_tok_s"], ".2f"),
                    _f(tp.get("reference_acceptance_length")),
                ],
                ["fp8-kv", _f(tp["fp8_output_tok_s"], ".2f"), _f(tp.get("fp8_acceptance_length"))],
                ["fp8 / reference", _f(tp["ratio"], ".3f"), ""],
            ],
        ),
        "",
    ]


def _per_prompt(doc: dict[str, Any]) -> list[str]:
    rows = []
    for row in doc["per_prompt"]:
        t = row["teacher_forced"] or {}
        found = row["fp8_degenerate"]
        degen = (", ".join(d["rule"] for d in found) + f" ({found[0]['reason']})") if found else "-"
        if row["reference_degenerate"]:
            degen += " (reference too: " + ", ".join(d["rule"] for d in row["reference_degenerate"]) + ")"
        first = "identical" if row["first_divergence"] is None else row["first_divergence"]
        rows.append(
            [
                row["id"],
                first,
                f"{row['matched_prefix']:.3f}",
                f"{row['reference_tokens']} / {row['fp8_tokens']}",
                _f(t.get("top1_agreement")),
                _f(t.get("mean_kl"), ".2e"),
                _cell(degen, 160),
                _cell(row["fp8_text"]),
            ]
        )
    head = ["id", "first divergence", "matched prefix", "tokens ref / fp8", "top-1 agree", "mean KL"]
    return ["## Per prompt", "", *table([*head, "degenerate (fp8)", "fp8 output"], rows), ""]


def _provenance(doc: dict[str, Any]) -> list[str]:
    prov = doc.get("provenance") or {}
    git = prov.get("git") or {}
    return [
        "## Provenance",
        "",
        f"- tool: {prov.get('tool')} {prov.get('tool_version', '')}, git {git.get('revision')}"
        f"{' (dirty)' if git.get('dirty') else ''}",
        f"- command: `{prov.get('command')}`",
        f"- time: {prov.get('utc_time')}",
        "- files: validation.json (this report's data, outputs included), bench-reference.json, bench-fp8.json",
        "",
    ]
