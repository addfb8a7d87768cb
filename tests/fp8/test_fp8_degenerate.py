"""The degenerate-output detector: broken outputs are caught with the right rule and
a reason that says why; ordinary answers (a phrase said twice, markdown, code)
pass every rule."""

from __future__ import annotations

import random

import pytest

from kimidflash.fp8 import degenerate as dg


def words(text: str) -> list[int]:
    """Word-level token ids: enough structure for the token rules."""
    vocab: dict[str, int] = {}
    return [vocab.setdefault(w, len(vocab)) for w in text.split()]


NORMAL = (
    "The sky looks blue because air molecules scatter short wavelengths of sunlight more strongly than long ones. "
    "When the sun is low, light travels through more air, so the blue is scattered away and sunsets look red. "
    "I think so. I think so. "  # a phrase said twice is normal speech
    "Here is a short list:\n- pack water\n- pack a map\n\n"
    "```python\ndef second_largest(xs):\n    ys = sorted(set(xs))\n    return ys[-2] if len(ys) > 1 else None\n```\n"
)


def test_normal_text_passes_every_rule_by_token_and_by_character() -> None:
    assert dg.check(NORMAL, words(NORMAL)) == []
    assert dg.check(NORMAL) == []  # character fallback when the server gave no ids


def test_a_phrase_repeated_twice_is_not_a_loop_but_four_times_over_the_span_is() -> None:
    phrase = [11, 12, 13, 14, 15, 16]
    assert dg.repetition_loop([1, 2, 3] + phrase * 2 + [4, 5, 6]) is None
    assert dg.repetition_loop(phrase * 3) is None  # 3 repeats < 4
    found = dg.repetition_loop([1, 2, 3] + phrase * 4)
    assert found is not None and found.rule == "repetition_loop"
    assert "6-token unit repeats 4 times" in found.reason and "from position 3" in found.reason


def test_a_short_loop_below_the_span_passes() -> None:
    assert dg.repetition_loop([7, 8] * 11) is None  # 22 tokens < 24
    assert dg.repetition_loop([7, 8] * 12) is not None


def test_loop_at_the_end_of_a_normal_start_is_found() -> None:
    toks = words(NORMAL)[:40] + [900, 901, 902] * 20
    found = dg.repetition_loop(toks)
    assert found is not None and "3-token unit repeats 20 times" in found.reason


def test_single_token_collapse_is_reported_by_both_token_rules() -> None:
    found = {f.rule: f.reason for f in dg.check("-" * 40, [12] * 40)}
    assert set(found) >= {"repetition_loop", "token_collapse"}
    assert "1 distinct tokens in 40" in found["token_collapse"]


def test_collapse_onto_few_tokens_without_a_period_is_caught_by_collapse_alone() -> None:
    rng = random.Random(0)
    toks = [rng.choice((3, 4, 5)) for _ in range(64)]
    assert dg.repetition_loop(toks, min_repeats=4, min_span=24) is None
    found = dg.token_collapse(toks)
    assert found is not None and "3 distinct tokens in 64" in found.reason


def test_one_dominant_token_is_collapse() -> None:
    toks = [1 if i % 3 else 100 + i for i in range(60)]  # 40 of 60 are token 1
    found = dg.token_collapse(toks)
    assert found is not None and "token 1 is 67% of 60 tokens" in found.reason
    assert dg.token_collapse(toks[:20]) is None  # too short to judge


@pytest.mark.parametrize(
    "garbage",
    [
        "ok \x00\x01\x02\x03 then",
        "Answer: \ufffd\ufffd\ufffd\ufffd",
        "\ue000\ue001 private use \ue002\ue003",
    ],
)
def test_byte_garbage_is_non_text(garbage: str) -> None:
    found = dg.non_text(garbage)
    assert found is not None and found.rule == "non_text" and "U+" in found.reason


def test_one_replacement_char_in_a_long_answer_is_tolerated() -> None:
    assert dg.non_text(NORMAL + "\ufffd") is None
    assert dg.non_text("tabs\tand\nnewlines\r\n are text") is None


def test_symbol_soup_and_empty() -> None:
    soup = "#$%^&*(){}[]<>~" * 4
    assert dg.symbol_soup(soup) is not None
    assert dg.symbol_soup("$$x^2 + y^2 = z^2$$ and \\frac{a}{b} holds for all a, b") is None
    assert dg.empty("  \n ") is not None and dg.empty("Paris.") is None
    assert [f.rule for f in dg.check("", [])] == ["empty"]


def test_a_loop_with_varying_separators_is_a_repeated_ngram() -> None:
    """Seen on the CPU reference (v31): the phrase returns with ", and" and a blank
    line between; no period holds, but the same 8 tokens recur again and again."""
    text = (
        "The novel was first published in 1813, and the 1813 edition was published in 1813. "
        "The 1813 edition was published in 1813, and the 1813 edition was published in 1813.\n\n"
        "The 1813 edition was published in 1813, and the 1813 edition was published in"
    )
    toks = words(text)
    assert dg.repetition_loop(toks) is None
    found = dg.repeated_ngram(toks, n=5)
    assert found is not None and "occur 5 times" in found.reason
    assert dg.repeated_ngram(toks, n=5, min_count=6) is None


def test_repeated_ngram_ignores_a_phrase_said_three_times_and_overlaps() -> None:
    phrase = list(range(10, 18))  # 8 tokens
    assert dg.repeated_ngram([1] + phrase + [2] + phrase + [3] + phrase + [4]) is None
    assert dg.repeated_ngram([1] + phrase + [2] + phrase + [3] + phrase + [4] + phrase) is not None
    # overlapping occurrences do not count: 31 equal tokens hold 3 disjoint 8-grams, 32 hold 4
    assert dg.repeated_ngram([9] * 31) is None
    assert dg.repeated_ngram([9] * 32) is not None
