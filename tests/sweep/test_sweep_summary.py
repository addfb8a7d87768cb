"""The sweep's summary maths on hand-made measurements: medians and spread, the same-run
speedup, the Pareto front and best under limits, the advisor's prediction from pooled repeats,
a missed pick's tie-or-wrong verdict, and which benchmark runs count as a measurement."""

from __future__ import annotations

import pytest

from kimidflash.sweep import execute
from kimidflash.sweep.grid import Case, Point
from kimidflash.sweep.measured import Measured
from kimidflash.sweep.predict import prediction
from kimidflash.sweep.summary import Limits, best, pareto, row


def _measured(pid: str, tps: list[float], per_user: float, p95_ms: float, case: str = "c1") -> Measured:
    p = Point(
        pid,
        (("NUM_SPECULATIVE_TOKENS", pid[1:]),) if pid != "none" else (("SPECULATIVE_METHOD", "none"),),
        "none",
        pid != "none",
        None,
        None,
    )
    c = Case(case, 1, 4, 1, 16, "builtin")
    docs = [{"output_throughput": t, "mean_per_user_output_throughput": per_user, "p95_e2el_ms": p95_ms} for t in tps]
    return Measured(p, c, docs)


def test_a_missed_pick_within_the_repeats_spread_is_a_tie_and_one_beyond_it_is_wrong():
    from kimidflash.sweep.predict import _miss
    from kimidflash.sweep.report import verdict

    base = _measured("none", [10.0, 10.5, 9.5], 10.0, 900)  # spread 10%
    k1, k2 = _measured("k1", [10.3, 10.2, 10.4], 10.0, 900), _measured("k2", [9.0, 9.05, 8.95], 9.0, 900)
    tie = {"agree": False, "predicted_best": None, "measured_best": 1}
    speedups, runs = {None: 1.0, 1: 1.03, 2: 0.9}, {None: base, 1: k1, 2: k2}
    tie["miss"] = _miss(tie, speedups, runs)
    assert tie["miss"] == {"gap": 0.03, "spread": 0.1, "within_spread": True}
    assert "3.0% below it, within the repeats' spread of 10.0%: a tie" in verdict(tie)
    wrong = {"agree": False, "predicted_best": 2, "measured_best": 1}
    wrong["miss"] = _miss(wrong, speedups, runs)
    assert wrong["miss"]["gap"] == 0.1444 and not wrong["miss"]["within_spread"]
    assert verdict(wrong).startswith(" (the prediction was wrong): the predicted choice measured 14.4% below")
    assert verdict({"agree": True}) == "" and verdict({"agree": False}) == " (the prediction was wrong)"


def test_rows_take_medians_spread_and_the_same_run_speedup():
    base = _measured("none", [10.0, 12.0, 11.0], 11.0, 900)
    r = row(_measured("k2", [15.0, 13.2, 16.5], 14.0, 800), base)
    assert r["output_tps"] == 15.0 and r["speedup"] == round(15.0 / 11.0, 4)
    assert r["output_tps_spread"] == round((16.5 - 13.2) / 15.0, 3)
    assert row(base, base)["speedup"] == 1.0


def test_pareto_front_and_best_under_limits():
    base = _measured("none", [10.0], 10.0, 500)
    rows = [
        row(_measured(pid, [tps], pu, p95), base)
        for pid, tps, pu, p95 in (
            ("none", 10.0, 10.0, 500),
            ("k1", 30.0, 4.0, 3000),
            ("k2", 20.0, 8.0, 1500),
            ("k3", 18.0, 7.0, 1600),
        )
    ]
    assert [r["point"] for r in pareto(rows)] == ["k1", "k2", "none"]  # k3 is beaten by k2 on both
    assert best(rows, Limits())["point"] == "k1"
    assert best(rows, Limits(max_p95_latency_s=2.0))["point"] == "k2"
    assert best(rows, Limits(min_user_tps=9))["point"] == "none"
    assert best(rows, Limits(max_p95_latency_s=0.1)) is None


def test_the_prediction_pools_the_repeats_and_an_impossible_run_is_reported_not_raised():
    case = Case("c1", 1, 4, 1, 16, "builtin")
    none = Point("none", (("SPECULATIVE_METHOD", "none"),), "none", False, None, None)
    k2 = Point("k2", (("NUM_SPECULATIVE_TOKENS", "2"),), "none", True, 2, "dflash")
    base = Measured(none, case, [{"output_throughput": 10.0}])
    docs = [
        {"output_throughput": 12.0, "spec_decode_num_drafts": n, "spec_decode_per_position_accepted_counts": c}
        for n, c in ((10, [8, 4]), (30, [24, 12]))
    ]
    pred = prediction(base, Measured(k2, case, docs))
    assert pred["profile"] == [0.8, 0.4] and pred["measured_ratio"] == 1.2
    # 2.2 tokens per step at 1.2x: a k=2 step costs 2.2 / 1.2 = 1.833, so verify = 0.4167 (draft 0)
    assert pred["cost"]["verify"] == 0.4167 and pred["predictions"] == {"1": 1.2706, "2": 1.2}
    assert pred["recommended_k"] == 1 and pred["line"] == "recommended NUM_SPECULATIVE_TOKENS=1"
    fast = [dict(d, output_throughput=30.0) for d in docs]
    assert "faster (3.000x) than its acceptance" in prediction(base, Measured(k2, case, fast))["error"]
    # an estimated fixed part beyond the whole measured step cost (0.833 above a plain step) is capped at it
    capped = prediction(base, Measured(k2, case, docs), (0.9, "fixed part: the reads"))
    assert capped["cost"]["draft"] == 0.8333 and capped["cost"]["verify"] == 0.0
    assert "capped at 0.8333" in capped["cost"]["source"] and capped["predictions"]["2"] == 1.2
    within = prediction(base, Measured(k2, case, docs), (0.5, "fixed part: the reads"))
    assert within["cost"]["draft"] == 0.5 and "capped" not in within["cost"]["source"]


@pytest.mark.parametrize(
    "doc, why",
    [
        (
            {"completed": 0, "num_prompts": 2, "requests": [{"error": "http_500", "error_detail": "boom"}]},
            "no request completed: http_500 (boom)",
        ),
        (
            {"completed": 2, "num_prompts": 2, "partial": True, "partial_reason": "3 connection errors in a row"},
            "the run stopped early: 3 connection errors in a row",
        ),
        (
            {"completed": 1, "failed": 1, "num_prompts": 2, "requests": [{"error": "timeout"}]},
            "1 of 2 requests failed: timeout",
        ),
        ({"completed": 2, "failed": 0, "num_prompts": 2}, None),
    ],
)
def test_a_benchmark_that_lost_requests_is_not_a_measurement_of_the_point(doc, why):
    assert execute.problem(doc) == why
