"""The speculative-token advisor: predict the best NUM_SPECULATIVE_TOKENS from one run.

Model (docs/acceptance-analysis.md):
- ``a[i]`` is the share of draft steps in which position ``i`` was accepted
  (vLLM's per-position counts over its drafts: cumulative, so non-increasing).
  A step that drafts ``k`` tokens yields ``1 + a[0] + ... + a[k-1]`` tokens (the
  target's own token plus the accepted drafts). Acceptance at a position is
  assumed not to depend on ``k``, so one run at a generous ``k`` gives every
  smaller ``k``'s profile.
- A step's cost relative to a plain decode step is ``1 + draft + verify * k``:
  a fixed drafting overhead, plus verification work that grows with the tokens
  verified (which is what hurts at high concurrency, where the target is
  compute-bound).
- Predicted throughput against no speculation: tokens per step / step cost.

The costs come, in order of precedence, from options, from the run and its
no-speculation baseline (the measured speedup at the run's ``k`` fixes the cost
there), or from the default fitted to the seed's MI300X outcome at 32 users
(k=2: +40%, k=8: -20%).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import AdviceError

# The seed's published per-position acceptance (Kimi-K2.5-DFlash serving K2.6), read at
# st=8: 64%, 34%, 18%, 9%, then "<3%" at positions 4-7 with an average acceptance of 16%
# over the 8 positions, so positions 4-7 share 8 * 0.16 - 1.25 = 0.03 (0.0075 each).
SEED_PROFILE = (0.64, 0.34, 0.18, 0.09, 0.0075, 0.0075, 0.0075, 0.0075)
# Its outcomes against no speculation at 32 users: (k, throughput ratio).
SEED_OUTCOMES = ((2, 1.40), (8, 0.80))
# Prefer the smallest k whose prediction is within this share of the best: the
# profile is measured with noise, and a smaller k verifies less and drafts less.
WITHIN = 0.01


@dataclass(frozen=True)
class CostModel:
    """A speculative step's cost relative to a plain decode step: 1 + draft + verify * k."""

    draft: float
    verify: float
    source: str

    def step_cost(self, k: int) -> float:
        return 1.0 + self.draft + self.verify * k


@dataclass(frozen=True)
class Prediction:
    k: int
    tokens_per_step: float
    step_cost: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_step / self.step_cost


@dataclass(frozen=True)
class Advice:
    predictions: tuple[Prediction, ...]
    cost: CostModel
    recommended_k: int | None  # None: no k is predicted to beat no speculation

    @property
    def line(self) -> str:
        if self.recommended_k is None:
            return "recommended SPECULATIVE_METHOD=none"
        return f"recommended NUM_SPECULATIVE_TOKENS={self.recommended_k}"


def cumulative(rates: Sequence[float], *, conditional: bool = False) -> tuple[float, ...]:
    """Per-position acceptance as vLLM counts it (cumulative), checked; ``conditional``
    rates (P(position i accepted | i-1 accepted)) are multiplied out first."""
    if not rates:
        raise AdviceError(
            "no per-position acceptance rates: the run drafted nothing (was it speculative, and did /metrics answer?)"
        )
    for i, r in enumerate(rates):
        if not (isinstance(r, (int, float)) and math.isfinite(r) and 0.0 <= r <= 1.0):
            raise AdviceError(f"per-position rate {i} is {r!r}: each must lie in 0..1")
    if conditional:
        out, p = [], 1.0
        for r in rates:
            p *= r
            out.append(p)
        return tuple(out)
    for i in range(1, len(rates)):
        if rates[i] > rates[i - 1] + 1e-9:
            raise AdviceError(
                f"per-position rates rise at position {i} ({rates[i - 1]} -> {rates[i]}): "
                "cumulative rates (vLLM's) cannot; pass --conditional if these are "
                "P(accepted | previous accepted)"
            )
    return tuple(float(r) for r in rates)


def tokens_per_step(profile: Sequence[float], k: int) -> float:
    return 1.0 + sum(profile[:k])


def _log_error(profile: Sequence[float], outcomes: Sequence[tuple[int, float]], draft: float, verify: float) -> float:
    cost = CostModel(draft, verify, "")
    return sum(
        (math.log(tokens_per_step(profile, k) / cost.step_cost(k)) - math.log(ratio)) ** 2 for k, ratio in outcomes
    )


def _argmin(f: Callable[[float], float], lo: float, hi: float, iterations: int = 80) -> float:
    """Golden-section search; the fit's error is unimodal in each cost term."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(iterations):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def fit_cost(profile: Sequence[float], outcomes: Sequence[tuple[int, float]], source: str) -> CostModel:
    """Least squares on log throughput ratios, both costs kept >= 0 (a negative
    drafting cost fits two points exactly and means nothing)."""

    def best_verify(draft: float) -> float:
        return _argmin(lambda v: _log_error(profile, outcomes, draft, v), 0.0, 4.0)

    draft = _argmin(lambda d: _log_error(profile, outcomes, d, best_verify(d)), 0.0, 4.0)
    return CostModel(round(draft, 4), round(best_verify(draft), 4), source)


DEFAULT_COST = fit_cost(
    SEED_PROFILE, SEED_OUTCOMES, "default: fitted to the seed's MI300X outcome at 32 users (k=2 +40%, k=8 -20%)"
)


def cost_from_run(profile: Sequence[float], k_run: int, measured_ratio: float, draft: float, source: str) -> CostModel:
    """The verify cost that makes the model reproduce the measured throughput ratio
    at the run's k, given the drafting cost."""
    if measured_ratio <= 0:
        raise AdviceError(f"measured throughput ratio {measured_ratio} must be positive")
    cost_at_k = tokens_per_step(profile, k_run) / measured_ratio
    verify = (cost_at_k - 1.0 - draft) / k_run
    if verify < 0:
        raise AdviceError(
            f"the run at k={k_run} is faster ({measured_ratio:.3f}x) than its acceptance "
            f"({tokens_per_step(profile, k_run):.3f} tokens per step) allows with a drafting "
            f"cost of {draft:g}: lower --draft-cost, or check that the baseline matches the run"
        )
    return CostModel(draft, round(verify, 4), source)


def advise(profile: Sequence[float], cost: CostModel, max_k: int | None = None) -> Advice:
    """Predictions for k = 1 .. the measured positions (or max_k, if smaller), and the pick."""
    top = len(profile) if max_k is None else min(max_k, len(profile))
    if top < 1:
        raise AdviceError(f"--max-k {max_k}: must be at least 1")
    preds = tuple(Prediction(k, tokens_per_step(profile, k), cost.step_cost(k)) for k in range(1, top + 1))
    best = max(p.speedup for p in preds)
    pick = None if best <= 1.0 else min(p.k for p in preds if p.speedup >= best * (1 - WITHIN))
    return Advice(preds, cost, pick)
