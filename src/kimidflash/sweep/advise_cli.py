"""`python -m kimidflash advise`: the advisor's command line.

    kimidflash advise dflash-k7-c8.json --baseline no-speculation-c8.json
    kimidflash advise dflash-k7-c8.json --baseline no-speculation-c8.json --also dflash-k1-c8.json
    kimidflash advise --per-position 0.64,0.34,0.18,0.09,0.03

Its last line is the one to act on: ``recommended NUM_SPECULATIVE_TOKENS=K``
or ``recommended SPECULATIVE_METHOD=none``. Exit 0, or 2 on bad input.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..bench.resultfile import load_result
from ..errors import AdviceError
from ..fsio import git_info, utc_now, write_json_atomic
from ..paths import REPO_ROOT, portable, portable_argv
from .advisor import DEFAULT_COST, Advice, CostModel, advise, cost_from_run, cumulative, fit_cost

SCHEMA = "kimidflash-advice/1"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kimidflash advise",
        description="Predict throughput for every "
        "NUM_SPECULATIVE_TOKENS from one run's per-position acceptance, and recommend one.",
    )
    p.add_argument(
        "result",
        nargs="?",
        type=Path,
        help="a benchmark result at a generous k (its /metrics per-position acceptance is read)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        help="the no-speculation result at the same concurrency: the run's measured speedup then fixes the verify cost",
    )
    p.add_argument(
        "--also",
        type=Path,
        nargs="+",
        default=[],
        metavar="RESULT",
        help="runs of the same drafter at other k (same concurrency, with --baseline): both the drafting "
        "and the verify cost are then fitted to every run",
    )
    p.add_argument(
        "--per-position",
        metavar="R0,R1,...",
        help="per-position acceptance rates instead of a result "
        "(cumulative, as vLLM counts them: share of drafts in which position i was accepted)",
    )
    p.add_argument("--conditional", action="store_true", help="the rates are P(position i accepted | i-1 accepted)")
    p.add_argument(
        "--draft-cost",
        type=float,
        help=f"drafting cost per step, relative to a decode step (default {DEFAULT_COST.draft:g}, the seed fit's)",
    )
    p.add_argument(
        "--verify-cost",
        type=float,
        help="verify cost per drafted token, relative to a decode step "
        f"(default: from --baseline, else {DEFAULT_COST.verify:g}, the seed fit's)",
    )
    p.add_argument("--max-k", type=int, help="the drafter's limit (its block size); default: the measured positions")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the predictions here")
    return p


def _rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AdviceError(f"--per-position {text!r}: expected numbers separated by commas") from None


def _measured_ratio(run: dict[str, Any], base: dict[str, Any], run_path: Path, base_path: Path) -> float:
    """The run's throughput over its baseline's, after checking they are comparable."""
    if base.get("speculative") is not False:
        raise AdviceError(f"--baseline {base_path}: not a no-speculation run")
    for doc, path in ((run, run_path), (base, base_path)):
        if doc.get("partial") or not doc.get("output_throughput"):
            raise AdviceError(f"{path}: partial or without throughput; not a measurement to fit costs to")
    if run.get("max_concurrency") != base.get("max_concurrency"):
        raise AdviceError(
            f"{run_path} ran at concurrency {run.get('max_concurrency')}, {base_path} at "
            f"{base.get('max_concurrency')}: the speedup must come from the same concurrency"
        )
    return run["output_throughput"] / base["output_throughput"]


def inputs(a: argparse.Namespace) -> tuple[tuple[float, ...], CostModel, dict[str, Any]]:
    """The profile, the cost model and where each came from."""
    if (a.result is None) == (a.per_position is None):
        raise AdviceError("give a benchmark result or --per-position (one of the two)")
    if a.result is not None:
        run = load_result(a.result)
        profile = cumulative(run.get("spec_decode_per_position_acceptance_rates") or [])
        source = {"result": portable(a.result), "concurrency": run.get("max_concurrency")}
    else:
        if a.baseline is not None:
            raise AdviceError("--baseline needs the speculative run's result beside it")
        profile = cumulative(_rates(a.per_position), conditional=a.conditional)
        source = {"per_position": list(profile)}
    for name in ("draft_cost", "verify_cost"):
        value = getattr(a, name)
        if value is not None and not value >= 0:
            raise AdviceError(f"--{name.replace('_', '-')} {value}: must be >= 0")
    draft = DEFAULT_COST.draft if a.draft_cost is None else a.draft_cost
    if a.also and (a.baseline is None or a.draft_cost is not None or a.verify_cost is not None):
        raise AdviceError(
            "--also fits both costs to the runs: it needs --baseline, and no --draft-cost or --verify-cost"
        )
    if a.verify_cost is not None:
        cost = CostModel(draft, a.verify_cost, "given")
    elif a.also:
        base = load_result(a.baseline)
        outcomes = [(len(profile), _measured_ratio(run, base, a.result, a.baseline))]
        for path in a.also:
            other = load_result(path)
            k = other.get("spec_decode_num_speculative_tokens")
            if not other.get("speculative") or not isinstance(k, int):
                raise AdviceError(f"--also {path}: not a speculative run with a known k")
            outcomes.append((k, _measured_ratio(other, base, path, a.baseline)))
        cost = fit_cost(profile, outcomes, "fitted to " + ", ".join(f"k={k} ({r:.3f}x)" for k, r in outcomes))
        source["measured_ratios"] = {str(k): round(r, 4) for k, r in outcomes}
    elif a.baseline is not None:
        ratio = _measured_ratio(run, load_result(a.baseline), a.result, a.baseline)
        cost = cost_from_run(
            profile,
            len(profile),
            ratio,
            draft,
            f"fitted to {a.result.name} over {a.baseline.name} ({ratio:.3f}x at k={len(profile)})",
        )
        source["measured_ratio"] = round(ratio, 4)
    else:
        cost = CostModel(draft, DEFAULT_COST.verify, DEFAULT_COST.source)
    return profile, cost, source


def print_advice(advice: Advice) -> None:
    t = Table(
        title=f"predicted throughput vs no speculation (cost: 1 + {advice.cost.draft:g} + "
        f"{advice.cost.verify:g}*k; {advice.cost.source})"
    )
    for col in ("k", "tokens / step", "step cost", "predicted speedup"):
        t.add_column(col, justify="right")
    for p in advice.predictions:
        mark = " <" if p.k == advice.recommended_k else ""
        t.add_row(str(p.k), f"{p.tokens_per_step:.3f}", f"{p.step_cost:.3f}", f"{p.speedup:.3f}x{mark}")
    Console().print(t)


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    profile, cost, source = inputs(a)
    advice = advise(profile, cost, a.max_k)
    print_advice(advice)
    if a.json is not None:
        provenance = {
            "tool": "kimidflash advise",
            "command": " ".join(portable_argv(["kimidflash", "advise", *argv])),
            "git": git_info(REPO_ROOT),
            "date": utc_now(),
        }
        write_json_atomic(
            a.json,
            {
                "schema": SCHEMA,
                "provenance": provenance,
                "inputs": source,
                "profile": list(profile),
                "cost": asdict(cost),
                "predictions": [{**asdict(p), "speedup": round(p.speedup, 4)} for p in advice.predictions],
                "recommended_k": advice.recommended_k,
                "line": advice.line,
            },
        )
    print(advice.line)
    return 0
