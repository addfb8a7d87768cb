"""The advisor inside a sweep: predict every k from the family's largest k, before
the other k run, and set the prediction beside what they then measured.

The prediction is written once (``advice/FAMILY-CASE.json``) as soon as the
baseline and the family's largest k are measured at that case; the sweep runs
those two first. It is never recomputed, so the comparison in the summary is
a prediction made before the measurement, and a wrong one shows as wrong.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from ..checkpoint_layout import LayoutError
from ..config import load_config
from ..errors import AdviceError, SweepError
from ..fsio import read_json_object, utc_now, write_json_atomic
from .advisor import DEFAULT_COST, advise, cost_from_run, cumulative, fit_cost, tokens_per_step
from .drafting import fixed_draft_cost
from .grid import Case, Plan, Point, families
from .measured import Measured, measured
from .rundir import RunFolder


def fixed_cost(plan: Plan, point: Point, case: Case) -> tuple[float, str]:
    """The fixed part of the step cost: a DFlash drafter's reads over the target's at the case's
    concurrency (drafting.py), when both checkpoints are on this machine; else the default's."""
    cfg = load_config(plan.base_config, dict(point.overrides))
    if cfg.speculative_method == "dflash":
        try:
            return (
                fixed_draft_cost(cfg.model_dir, cfg.draft_model_dir, case.concurrency, cfg.dtype),
                f"fixed part: the drafter's weight reads over the target's at batch {case.concurrency}",
            )
        except (LayoutError, OSError, KeyError) as e:
            return DEFAULT_COST.draft, f"fixed part: the default's ({e})"
    return DEFAULT_COST.draft, "fixed part: the default's"


def prediction(
    base: Measured, run: Measured, fixed: tuple[float, str] = (DEFAULT_COST.draft, "the default's")
) -> dict[str, Any]:
    """The advisor on one run at its k and its baseline, as the `advise` command computes it: the fixed
    part of the cost given (`fixed_cost`), the per-token part from the measured ratio.

    The fixed part is an estimate, the run a measurement: where the run's whole step cost above a plain
    step is smaller than the estimate, the fixed part is capped at it (per-token part 0) rather than
    giving no advice."""
    out: dict[str, Any] = {"from_point": run.point.id, "k_run": run.point.k, "case": run.case.id, "date": utc_now()}
    try:
        profile = cumulative(run.profile())
        ratio = (run.median("output_throughput") or 0.0) / (base.median("output_throughput") or float("nan"))
        draft, why = fixed
        room = tokens_per_step(profile, len(profile)) / ratio - 1.0 if ratio > 0 else draft
        if 0.0 <= room < draft:  # floored to 4 places, so the per-token part left is never below 0
            draft = math.floor(room * 1e4) / 1e4
            why = f"{why}, capped at {draft:.4f}: the run's whole step cost above a plain step"
        cost = cost_from_run(
            profile,
            len(profile),
            ratio,
            draft,
            f"{why}; per token: fitted to {run.point.id} over {base.point.id} at {run.case.id} ({ratio:.3f}x)",
        )
        advice = advise(profile, cost, run.point.k)
    except AdviceError as e:
        return {**out, "error": str(e)}
    return {
        **out,
        "profile": list(profile),
        "measured_ratio": round(ratio, 4),
        "cost": asdict(cost),
        "predictions": {str(p.k): round(p.speedup, 4) for p in advice.predictions},
        "recommended_k": advice.recommended_k,
        "line": advice.line,
    }


def predict_ready(plan: Plan, folder: RunFolder) -> None:
    """Write the predictions whose inputs are now complete (and none yet exists)."""
    by_id = {p.id: p for p in plan.points}
    for family, pts in families(plan.points).items():
        top = pts[-1]
        if len(pts) < 2:
            continue  # nothing to predict: one k only
        for case in plan.cases:
            path = folder.advice_path(family, case)
            if path.is_file():
                continue
            base = measured(folder, by_id[top.baseline_id], case, plan.repeats)
            run = measured(folder, top, case, plan.repeats)
            if base is None or run is None:
                continue
            doc = {"family": family, **prediction(base, run, fixed_cost(plan, top, case))}
            write_json_atomic(path, doc)
            folder.event("predicted", family=family, case=case.id, line=doc.get("line"), error=doc.get("error"))


def _miss(
    cmp: dict[str, Any], speedups: dict[int | None, float], runs: dict[int | None, Measured | None]
) -> dict[str, Any] | None:
    """How far the predicted choice measured below the best, and whether the repeats can tell them
    apart: a gap within the larger spread of the two points' repeats is a tie the sweep did not
    resolve, not a wrong model. Both maps are keyed by k, None for no speculation (the baseline,
    speedup 1). None when the predicted k was not measured."""
    pred, best = cmp["predicted_best"], cmp["measured_best"]
    got = speedups.get(pred)
    if not got:
        return None
    gap = speedups[best] / got - 1.0
    noise = max(
        (m.spread("output_throughput") or 0.0 for m in (runs.get(pred), runs.get(best)) if m is not None), default=0.0
    )
    return {"gap": round(gap, 4), "spread": round(noise, 4), "within_spread": gap <= noise}


def compare(
    folder: RunFolder, family: str, pts: list[Point], case: Case, rows: dict[tuple[str, str], Measured]
) -> dict[str, Any] | None:
    """Prediction and measurement side by side for one family at one case; None
    when no prediction was made."""
    path = folder.advice_path(family, case)
    if not path.is_file():
        return None
    pred = read_json_object(path, "advice", SweepError)
    base = rows.get((pts[0].baseline_id, case.id))
    out: dict[str, Any] = {"family": family, "case": case.id, "prediction": pred, "by_k": []}
    if base is None or "error" in pred:
        return out
    base_tps = base.median("output_throughput")
    outcomes: list[tuple[int, float]] = []
    for p in pts:
        m = rows.get((p.id, case.id))
        tps = m.median("output_throughput") if m else None
        meas = tps / base_tps if tps is not None and base_tps else None
        predicted = pred["predictions"].get(str(p.k))
        err = (predicted - meas) / meas if predicted is not None and meas else None
        out["by_k"].append(
            {
                "k": p.k,
                "point": p.id,
                "predicted_speedup": predicted,
                "measured_speedup": None if meas is None else round(meas, 4),
                "error": None if err is None else round(err, 4),
            }
        )
        if meas is not None and p.k is not None:
            outcomes.append((p.k, meas))
    if outcomes:
        best_k, best = max(outcomes, key=lambda kv: kv[1])
        out["measured_best"] = best_k if best > 1.0 else None
        out["predicted_best"] = pred.get("recommended_k")
        out["agree"] = out["measured_best"] == out["predicted_best"]
        if not out["agree"]:
            out["miss"] = _miss(
                out, {None: 1.0, **dict(outcomes)}, {None: base, **{p.k: rows.get((p.id, case.id)) for p in pts}}
            )
    if len(outcomes) >= 2:  # two unknowns: fit both costs to every measured k
        refit = fit_cost(pred["profile"], outcomes, "fitted to every measured k")
        out["refit"] = {"cost": asdict(refit), "best": advise(pred["profile"], refit).recommended_k}
    return out
