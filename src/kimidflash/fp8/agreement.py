"""How far do FP8-KV outputs drift from the BF16-KV ones? Pure math, no I/O.

Two measures, because each misses what the other sees:

* **Token agreement** (free-running greedy outputs): per prompt the first position
  where the two outputs differ, the share of prompts whose outputs are identical,
  and the mean matched-prefix fraction. Greedy decoding amplifies one flipped
  near-tie into a different continuation, so this is strict.
* **Teacher-forced divergence**: both servers score the *same* token sequence (the
  prompt plus the reference's output) and return each position's top-k logprobs
  (vLLM's ``prompt_logprobs``); per position we compare the two next-token
  distributions. This measures the cache's error at every step without the
  amplification, and a flipped near-tie shows as a tiny KL, not a failure.

The KL is truncated, because a server returns only its top k tokens. What we
report is KL(P||Q) of P (reference) and Q (FP8) coarse-grained to the tokens
present in both top-k lists plus one bucket holding the rest of each
distribution. By the log-sum inequality (data processing) merging outcomes never
increases KL, so the figure is a **lower bound** of the true KL, exact when the
shared tokens carry all the mass; ``uncovered`` (the reference mass outside the
shared tokens) says how tight the bound is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Probability mass below this counts as zero (rounding of logprobs can make a
# "rest" bucket slightly negative).
MASS_EPS = 1e-9


def first_divergence(ref: Sequence[int], test: Sequence[int]) -> int | None:
    """Index of the first differing token; None when the sequences are identical.
    A sequence that is a strict prefix of the other diverges at its length."""
    for i, (a, b) in enumerate(zip(ref, test, strict=False)):
        if a != b:
            return i
    return None if len(ref) == len(test) else min(len(ref), len(test))


def matched_prefix_fraction(ref: Sequence[int], test: Sequence[int]) -> float:
    """Length of the common prefix over the longer output (1.0 when identical;
    two empty outputs agree fully)."""
    longest = max(len(ref), len(test))
    if longest == 0:
        return 1.0
    d = first_divergence(ref, test)
    return 1.0 if d is None else d / longest


@dataclass(frozen=True)
class TokenAgreement:
    prompts: int
    identical: int
    identical_share: float
    mean_matched_prefix: float
    first_divergence: tuple[int | None, ...]  # per prompt, in order


def token_agreement(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> TokenAgreement:
    """Summary over (reference ids, test ids) pairs, one per prompt."""
    if not pairs:
        raise ValueError("no outputs to compare")
    divs = tuple(first_divergence(r, t) for r, t in pairs)
    identical = sum(d is None for d in divs)
    mean = sum(matched_prefix_fraction(r, t) for r, t in pairs) / len(pairs)
    return TokenAgreement(len(pairs), identical, identical / len(pairs), mean, divs)


@dataclass(frozen=True)
class PositionDivergence:
    kl: float  # lower bound of KL(P_ref || P_test), nats
    uncovered: float  # reference mass outside the tokens both top-k lists share
    top1_ref: int
    top1_test: int

    @property
    def top1_agree(self) -> bool:
        return self.top1_ref == self.top1_test


def _top1(logprobs: Mapping[int, float]) -> int:
    return max(logprobs.items(), key=lambda kv: (kv[1], -kv[0]))[0]


def position_divergence(ref: Mapping[int, float], test: Mapping[int, float]) -> PositionDivergence:
    """Truncated KL and top-1 of one position from the two servers' {token: logprob}
    (each the top-k list, possibly plus the scored token)."""
    if not ref or not test:
        raise ValueError("a position needs logprobs from both servers")
    shared = [t for t in ref if t in test]
    kl = 0.0
    p_in = q_in = 0.0
    for t in shared:
        p, q = math.exp(ref[t]), math.exp(test[t])
        p_in += p
        q_in += q
        if p > 0:
            kl += p * (ref[t] - test[t])
    p_rest, q_rest = max(0.0, 1.0 - p_in), max(0.0, 1.0 - q_in)
    if p_rest > MASS_EPS:
        kl += p_rest * math.log(p_rest / max(q_rest, MASS_EPS))
    return PositionDivergence(max(kl, 0.0), p_rest, _top1(ref), _top1(test))


@dataclass(frozen=True)
class Divergence:
    positions: int
    mean_kl: float
    p99_kl: float
    max_kl: float
    top1_agreement: float
    mean_uncovered: float


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation: the value some position had)."""
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


def summarize(positions: Sequence[PositionDivergence]) -> Divergence:
    if not positions:
        raise ValueError("no scored positions")
    kls = sorted(p.kl for p in positions)
    n = len(positions)
    return Divergence(
        n,
        sum(kls) / n,
        _quantile(kls, 0.99),
        kls[-1],
        sum(p.top1_agree for p in positions) / n,
        sum(p.uncovered for p in positions) / n,
    )
