"""`validate-fp8.sh CONFIG`: does the FP8-KV deployment still say what the BF16-KV one says?

The same model is served twice through the recipe's own `serve` (one server at a
time, each on a free loopback port): first the reference, CONFIG with
``KV_CACHE_DTYPE=auto KV_SCALE_POLICY=none``, then CONFIG as given. Each answers the
shipped validation prompts greedily, scores the reference's outputs teacher-forced
(``requests``), and runs a short benchmark (``kimidflash.bench``). ``agreement``
compares, ``degenerate`` looks for broken outputs, ``report`` writes the markdown.

Why the reference may need another MODEL_DIR: vLLM (0.32 read) resolves
``--kv-cache-dtype auto`` to the checkpoint's ``kv_cache_scheme`` when the config has
one, so serving a KV-scale overlay (``fp8.checkpoint.write_overlay``) with ``auto``
stores FP8 after all. The reference therefore serves the checkpoint the overlay
links to (same weights), or ``--reference-model``; and the reference's log is
checked for vLLM's "Using fp8 data type to store kv cache" line, so a reference
that is secretly FP8 is a failed check, never a silent pass.

Exit codes: 0 pass, 1 the check failed (one line says why), 2 bad input (nothing
served, nothing written).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..background import ServeError, serving_process
from ..bench import BenchConfig, BenchError, run_benchmark
from ..bench.prompts import parse_jsonl
from ..bench.provenance import local_provenance, recipe_info
from ..checkpoint_layout import read_config
from ..config import ConfigError, load_config
from ..errors import CheckFailed, CheckpointError, InputError, LayoutError, ServerRequestError
from ..fsio import atomic_dir, write_json_atomic, write_text_atomic
from ..paths import link_targets, portable
from . import agreement, degenerate, report
from .checkpoint import verify
from .requests import generate, score

SCHEMA = "kimidflash-fp8-validation/1"
PROMPTS_FILE = "validation_prompts.jsonl"
DEFAULT_MIN_AGREEMENT = 0.9
FP8_LOG_LINE = "data type to store kv cache"  # vLLM: "Using fp8 data type to store kv cache. ..."
# vLLM: "<GPU|CPU> KV cache size: 87,360 tokens, Maximum concurrency ..." (kv_cache_utils.py)
KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


@dataclass(frozen=True)
class Options:
    config: str
    overrides: dict[str, str]
    prompts: int
    max_tokens: int
    min_agreement: float
    out: Path
    reference_model: str | None
    top_k: int
    bench_sessions: int
    port: int | None
    argv: tuple[str, ...]


def shipped_prompts() -> list[tuple[str, str]]:
    """(id, text) of the shipped validation set (disjoint from the calibration set)."""
    text = resources.files("kimidflash.fp8").joinpath("data", PROMPTS_FILE).read_text(encoding="utf-8")
    return [(c.id, c.turns[0]) for c in parse_jsonl(text, PROMPTS_FILE)]


def overlay_source(model_dir: Path) -> Path | None:
    """The checkpoint a KV-scale overlay links to; None when ``model_dir`` has no
    ``kv_cache_scheme`` (it already is a plain checkpoint)."""
    try:
        cfg = read_config(model_dir) or {}
    except LayoutError:  # not a checkpoint this module can read: nothing to follow
        return None
    quant = cfg.get("quantization_config") or {}
    if not (isinstance(quant, dict) and quant.get("kv_cache_scheme")):
        return None
    parents = [Path(d) for d in link_targets(model_dir)]
    if len(parents) != 1:
        raise InputError(
            f"MODEL_DIR {model_dir} has a kv_cache_scheme (vLLM would store even KV_CACHE_DTYPE=auto "
            "in FP8) and is not an overlay of one checkpoint; pass --reference-model DIR"
        )
    (src,) = parents
    if not (src / "config.json").is_file():
        raise InputError(f"MODEL_DIR {model_dir}: the checkpoint it links to ({src}) has no config.json")
    return src


def plan(opts: Options) -> tuple[dict[str, str], dict[str, str]]:
    """(reference overrides, FP8 overrides), both already loaded once so that a
    bad key or an unservable combination is exit 2 before anything starts."""
    try:
        fp8 = load_config(opts.config, opts.overrides)
    except ConfigError as exc:
        raise InputError(f"{opts.config}: {exc}") from None
    if not str(fp8.kv_cache_dtype).startswith("fp8"):
        raise InputError(
            f"{opts.config}: KV_CACHE_DTYPE={fp8.kv_cache_dtype} is not an FP8 KV cache; "
            "validate-fp8 compares an FP8 config with its BF16-KV twin (set KV_CACHE_DTYPE=fp8)"
        )
    # The reference keeps every cache in the model dtype, the draft's too, and no seed.
    ref_over = {
        **opts.overrides,
        "KV_CACHE_DTYPE": "auto",
        "KV_SCALE_POLICY": "none",
        "DRAFT_KV_CACHE_DTYPE": "",
        "KV_SCALES_FILE": "",
    }
    if opts.reference_model:
        ref_over["MODEL_DIR"] = opts.reference_model
    else:
        src = overlay_source(Path(fp8.model_dir))
        if src is not None:
            ref_over["MODEL_DIR"] = str(src)
    try:
        load_config(opts.config, ref_over)
    except ConfigError as exc:
        raise InputError(f"{opts.config} as the BF16-KV reference: {exc}") from None
    return ref_over, dict(opts.overrides)


def _serve_and_measure(
    opts: Options,
    label: str,
    overrides: dict[str, str],
    prompts: list[tuple[str, str]],
    to_score: list[tuple[str, Sequence[int], int]] | None,
    logs: Path,
    port: int | None,
) -> dict[str, Any]:
    """Start one server, ask it everything, stop it. ``to_score`` None: score this
    server's own outputs (the reference)."""
    cfg = load_config(opts.config, overrides)
    model = cfg.served_model_name
    log = logs / f"serve-{label}.log"
    overrides_list = [f"{k}={v}" for k, v in overrides.items()]
    t0 = time.monotonic()
    try:
        with serving_process(opts.config, overrides_list, log, timeout=float(cfg.health_timeout) + 600, port=port) as (
            _,
            base,
        ):
            started = time.monotonic() - t0
            outputs = generate(base, model, prompts, opts.max_tokens)
            seqs = (
                to_score
                if to_score is not None
                else [(o.prompt_id, o.prompt_token_ids + o.token_ids, len(o.prompt_token_ids)) for o in outputs]
            )
            scored = score(base, model, seqs, opts.top_k)
            bench = run_benchmark(
                BenchConfig(
                    base_url=f"{base}/v1",
                    model=model,
                    sessions=opts.bench_sessions,
                    max_tokens=opts.max_tokens,
                    warmup=1,
                    label=label,
                    recipe_config=opts.config,
                    recipe_overrides=overrides,
                    argv=list(opts.argv),
                )
            )
    except ServeError as exc:
        said = [ln.strip() for ln in str(exc).splitlines() if "FAILED" in ln or "error" in ln.lower()]
        raise CheckFailed(
            f"the {label} server did not start: {(said or str(exc).splitlines())[-1][:300]} (log: {portable(log)})"
        ) from None
    except (ServerRequestError, BenchError) as exc:
        raise CheckFailed(f"the {label} server: {exc} (log: {portable(log)})") from None
    text = log.read_text(errors="replace")
    fp8_log = [
        line[line.find("Using") :].strip() for line in text.splitlines() if FP8_LOG_LINE in line and "Using" in line
    ]
    tokens = KV_TOKENS.search(text)
    return {
        "label": label,
        "overrides": overrides,
        "outputs": outputs,
        "scored": scored,
        "bench": bench,
        "start_seconds": round(started, 1),
        "fp8_log": fp8_log[:1],
        "kv_cache_tokens": int(tokens.group(1).replace(",", "")) if tokens else None,
    }


def checkpoint_scales(model_dir: str) -> dict[str, Any] | None:
    """The KV scales the FP8 server loaded from its checkpoint, when it has any (the
    report names what was validated, not only where it lay)."""

    try:
        rep = verify(model_dir)
    except (CheckpointError, OSError):
        return None
    return {"summary": rep.summary(), "k_scale": list(rep.k_scales), "v_scale": list(rep.v_scales)}


def per_prompt(
    ref: dict[str, Any], fp8: dict[str, Any], tok: agreement.TokenAgreement
) -> tuple[list[dict[str, Any]], list, float | None]:
    """Each prompt's row, every teacher-forced position, and how often the
    reference's own top-1 is the token it generated (its self-consistency)."""
    rows, positions = [], []
    self_consistent = 0
    for i, (r, f) in enumerate(zip(ref["outputs"], fp8["outputs"], strict=False)):
        pos = [agreement.position_divergence(a, b) for a, b in zip(ref["scored"][i], fp8["scored"][i], strict=False)]
        positions += pos
        self_consistent += sum(p.top1_ref == t for p, t in zip(pos, r.token_ids, strict=False))
        div = agreement.summarize(pos) if pos else None
        rows.append(
            {
                "id": r.prompt_id,
                "first_divergence": tok.first_divergence[i],
                "matched_prefix": round(agreement.matched_prefix_fraction(r.token_ids, f.token_ids), 4),
                "reference_tokens": len(r.token_ids),
                "fp8_tokens": len(f.token_ids),
                "teacher_forced": asdict(div) if div else None,
                "reference_degenerate": [asdict(x) for x in degenerate.check(r.text, r.token_ids)],
                "fp8_degenerate": [asdict(x) for x in degenerate.check(f.text, f.token_ids)],
                "reference_text": r.text,
                "fp8_text": f.text,
            }
        )
    return rows, positions, (round(self_consistent / len(positions), 4) if positions else None)


def verdict(
    opts: Options, ref: dict[str, Any], fp8: dict[str, Any], top1_agreement: float, rows: list[dict[str, Any]]
) -> list[str]:
    """Why the check fails; empty when it passes."""
    reasons = []
    if ref["fp8_log"]:
        reasons.append(
            f"the reference server stored its KV cache quantized too ({ref['fp8_log'][0][:40]!r}); "
            "it is no BF16-KV reference"
        )
    if not fp8["fp8_log"]:
        reasons.append(f"the FP8 server's log never says {FP8_LOG_LINE!r}: it did not store an FP8 KV cache")
    if top1_agreement < opts.min_agreement:
        reasons.append(f"teacher-forced top-1 agreement {top1_agreement:.3f} < {opts.min_agreement:g}")
    broken = [row for row in rows if row["fp8_degenerate"] and not row["reference_degenerate"]]
    if broken:
        first = broken[0]
        reasons.append(
            f"{len(broken)} FP8 output(s) degenerate where the reference's do not "
            f"(first: {first['id']}: {first['fp8_degenerate'][0]['reason']})"
        )
    return reasons


def evaluate(opts: Options, ref: dict[str, Any], fp8: dict[str, Any]) -> dict[str, Any]:
    """The validation document: per prompt, summaries, verdict (no I/O but the
    FP8 checkpoint's scale tensors)."""
    tok = agreement.token_agreement(
        [(r.token_ids, f.token_ids) for r, f in zip(ref["outputs"], fp8["outputs"], strict=False)]
    )
    rows, positions, self_top1 = per_prompt(ref, fp8, tok)
    tf = agreement.summarize(positions)
    reasons = verdict(opts, ref, fp8, tf.top1_agreement, rows)
    ref_tps, fp8_tps = ref["bench"].get("output_throughput"), fp8["bench"].get("output_throughput")
    ref_al, fp8_al = (s["bench"].get("spec_decode_acceptance_length") for s in (ref, fp8))
    return {
        "schema": SCHEMA,
        "passed": not reasons,
        "reasons": reasons,
        "settings": {
            "prompts": len(rows),
            "max_tokens": opts.max_tokens,
            "min_agreement": opts.min_agreement,
            "top_k": opts.top_k,
            "temperature": 0.0,
            "bench_sessions": opts.bench_sessions,
            "gate": "teacher-forced top-1 agreement >= min_agreement, and no FP8 output degenerate "
            "whose reference output is not",
        },
        "token_agreement": {
            "identical": tok.identical,
            "identical_share": round(tok.identical_share, 4),
            "mean_matched_prefix": round(tok.mean_matched_prefix, 4),
        },
        "teacher_forced": {
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(tf).items()},
            "reference_self_top1": self_top1,
            "kl": "lower bound of KL(P_reference || P_fp8) in nats: both top-k lists' shared tokens "
            "plus one bucket for the rest (log-sum inequality)",
        },
        "throughput": {
            "reference_output_tok_s": ref_tps,
            "fp8_output_tok_s": fp8_tps,
            "ratio": round(fp8_tps / ref_tps, 4) if ref_tps and fp8_tps else None,
            "reference_acceptance_length": ref_al,
            "fp8_acceptance_length": fp8_al,
        },
        "fp8_checkpoint_scales": checkpoint_scales(load_config(opts.config, fp8["overrides"]).model_dir),
        "servers": {
            s["label"]: {
                "overrides": {k: portable(v) if os.path.isabs(v) else v for k, v in s["overrides"].items()},
                "recipe": recipe_info(opts.config, s["overrides"]),
                "ready_after_s": s["start_seconds"],
                "vllm_kv_log": s["fp8_log"][0] if s["fp8_log"] else None,
                "kv_cache_tokens": s.get("kv_cache_tokens"),
            }
            for s in (ref, fp8)
        },
        "per_prompt": rows,
    }


def write_outputs(out: Path, doc: dict[str, Any], ref_bench: dict[str, Any], fp8_bench: dict[str, Any]) -> Path:
    """All files at once: built in a sibling temp dir, then renamed over ``out``."""
    with atomic_dir(out) as tmp:
        write_json_atomic(tmp / "validation.json", doc)
        write_json_atomic(tmp / "bench-reference.json", ref_bench)
        write_json_atomic(tmp / "bench-fp8.json", fp8_bench)
        write_text_atomic(tmp / "report.md", report.render(doc))
    return out


def run(opts: Options) -> tuple[int, str]:
    ref_over, fp8_over = plan(opts)
    prompts = shipped_prompts()[: opts.prompts]
    # Server logs stay in a temp dir, kept only when a server failed (the message names them).
    logs = Path(tempfile.mkdtemp(prefix="kimidflash-validate-fp8-"))
    # A given --port serves the reference; the FP8 server takes the next one, since the
    # port just closed lingers in TIME_WAIT and serve's preflight would call it busy.
    ref = _serve_and_measure(opts, "auto-kv", ref_over, prompts, None, logs, opts.port)
    seqs = [(o.prompt_id, o.prompt_token_ids + o.token_ids, len(o.prompt_token_ids)) for o in ref["outputs"]]
    fp8 = _serve_and_measure(opts, "fp8-kv", fp8_over, prompts, seqs, logs, opts.port and opts.port + 1)
    shutil.rmtree(logs, ignore_errors=True)
    doc = evaluate(opts, ref, fp8)
    doc["provenance"] = {**local_provenance(opts.argv), "tool": "kimidflash.fp8.validate"}
    write_outputs(opts.out, doc, ref["bench"], fp8["bench"])
    verdict = "PASS" if doc["passed"] else "FAIL: " + "; ".join(doc["reasons"])
    return (0 if doc["passed"] else 1), f"validate-fp8: {verdict} (report: {portable(opts.out / 'report.md')})"
