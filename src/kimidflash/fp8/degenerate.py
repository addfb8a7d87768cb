"""Is an output degenerate? Pure rules, each with its threshold and a reason string.

Why a detector at all: agreement with the BF16-KV outputs says how far FP8 drifts,
but a badly scaled FP8 cache does not drift, it breaks: the model loops, collapses
onto one or two tokens, or emits bytes that are not text (vLLM issues 13133,
27364). Those outputs must fail validation even if the reference happened to be
short or also imperfect, and the report has to say which rule fired and why.

Every rule is a pure function of one output (its token ids and/or its text) that
returns ``None`` or a :class:`Finding`; thresholds are keyword arguments with the
defaults below, chosen so ordinary answers pass: a phrase said twice, a markdown
rule, code indentation and a short answer are all normal. ``check`` runs every rule.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# repetition_loop: a unit of at most MAX_PERIOD tokens repeated back to back at
# least MIN_REPEATS times over at least MIN_SPAN tokens. Saying a phrase twice
# (2 repeats) or a short "- - -" (span < 24) is normal text.
MAX_PERIOD = 64
MIN_REPEATS = 4
MIN_SPAN = 24
# repeated_ngram: one run of NGRAM tokens occurring at least NGRAM_MIN_COUNT times
# anywhere in the output. Catches loops whose separators vary ("X, and X.\n\nX, and
# X"), which are not periodic; 8 tokens x 4 is more than a list or code repeats.
NGRAM = 8
NGRAM_MIN_COUNT = 4
# token_collapse: over at least COLLAPSE_MIN_TOKENS tokens, fewer than this share
# distinct or one token over TOP_SHARE of the output. Normal prose of 64 tokens
# has roughly 50-70% distinct tokens and no token above ~15%.
COLLAPSE_MIN_TOKENS = 32
MIN_DISTINCT_SHARE = 0.15
TOP_SHARE = 0.5
# non_text: characters that are not text (C0/C1 controls other than tab and
# newlines, U+FFFD from undecodable bytes, surrogates, private use, unassigned)
# above this share of the output, or at least NON_TEXT_MIN of them.
NON_TEXT_SHARE = 0.02
NON_TEXT_MIN = 4
# symbol_soup: over at least SOUP_MIN_CHARS characters, fewer than this share of
# letters, digits and whitespace. Code and LaTeX stay well above it.
SOUP_MIN_CHARS = 32
MIN_WORDY_SHARE = 0.3


@dataclass(frozen=True)
class Finding:
    rule: str
    reason: str


def repetition_loop(
    tokens: Sequence[object], *, max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN
) -> Finding | None:
    """The longest stretch where ``tokens[i] == tokens[i + p]`` for some period p
    is a unit of p tokens said (run + p) / p times in a row; flag it when it is
    long and repeated enough. Works on token ids or on characters."""
    n = len(tokens)
    best: tuple[int, int, int] | None = None  # (span, period, start)
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(n - p):
            if tokens[i] == tokens[i + p]:
                run += 1
                span = run + p
                if span // p >= min_repeats and span >= min_span and (best is None or span > best[0]):
                    best = (span, p, i + 1 - run)
            else:
                run = 0
    if best is None:
        return None
    span, p, start = best
    return Finding(
        "repetition_loop",
        f"a {p}-token unit repeats {span // p} times back to back "
        f"({span} tokens from position {start}; limit {min_repeats} repeats over "
        f"{min_span} tokens)",
    )


def repeated_ngram(tokens: Sequence[object], *, n: int = NGRAM, min_count: int = NGRAM_MIN_COUNT) -> Finding | None:
    """The same n tokens said ``min_count`` times or more (occurrences may overlap
    only by less than n: a periodic loop of a shorter unit is the loop rule's)."""
    last: dict[tuple[object, ...], int] = {}
    counts: dict[tuple[object, ...], int] = {}
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if gram in last and i - last[gram] < n:
            continue  # overlapping occurrence
        last[gram] = i
        counts[gram] = counts.get(gram, 0) + 1
    if not counts:
        return None
    gram, count = max(counts.items(), key=lambda kv: kv[1])
    if count < min_count:
        return None
    return Finding("repeated_ngram", f"the same {n} tokens occur {count} times (limit {min_count - 1}): {gram!r}"[:200])


def token_collapse(
    tokens: Sequence[object],
    *,
    min_tokens: int = COLLAPSE_MIN_TOKENS,
    min_distinct_share: float = MIN_DISTINCT_SHARE,
    top_share: float = TOP_SHARE,
) -> Finding | None:
    """Few distinct tokens, or one token dominating, over a long enough output."""
    n = len(tokens)
    if n < min_tokens:
        return None
    counts: dict[object, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    distinct = len(counts)
    top_token, top = max(counts.items(), key=lambda kv: kv[1])
    if distinct / n < min_distinct_share:
        return Finding(
            "token_collapse",
            f"only {distinct} distinct tokens in {n} ({distinct / n:.0%}; limit {min_distinct_share:.0%})",
        )
    if top / n > top_share:
        return Finding("token_collapse", f"token {top_token!r} is {top / n:.0%} of {n} tokens (limit {top_share:.0%})")
    return None


def _non_text(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    if ch == "\ufffd":
        return True
    return unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn")


def non_text(text: str, *, max_share: float = NON_TEXT_SHARE, min_count: int = NON_TEXT_MIN) -> Finding | None:
    """Control characters, replacement characters (undecodable bytes), surrogates,
    private-use or unassigned code points: what byte garbage decodes to."""
    bad = [ch for ch in text if _non_text(ch)]
    if not bad or (len(bad) < min_count and len(bad) / len(text) < max_share):
        return None
    shown = ", ".join(f"U+{ord(c):04X}" for c in dict.fromkeys(bad))
    return Finding(
        "non_text",
        f"{len(bad)} non-text characters in {len(text)} ({shown[:80]}; limit {min_count - 1} or {max_share:.0%})",
    )


def symbol_soup(
    text: str, *, min_chars: int = SOUP_MIN_CHARS, min_wordy_share: float = MIN_WORDY_SHARE
) -> Finding | None:
    """Printable but meaningless: hardly any letters, digits or spaces."""
    stripped = text.strip()
    if len(stripped) < min_chars:
        return None
    wordy = sum(1 for ch in stripped if ch.isalnum() or ch.isspace())
    if wordy / len(stripped) >= min_wordy_share:
        return None
    return Finding(
        "symbol_soup",
        f"only {wordy / len(stripped):.0%} of {len(stripped)} characters are letters, "
        f"digits or spaces (limit {min_wordy_share:.0%})",
    )


def empty(text: str) -> Finding | None:
    """No visible output at all (a broken cache often ends at the first step)."""
    return None if text.strip() else Finding("empty", "the output is empty or only whitespace")


TokenRule = Callable[[Sequence[object]], "Finding | None"]
TextRule = Callable[[str], "Finding | None"]
TOKEN_RULES: tuple[TokenRule, ...] = (repetition_loop, repeated_ngram, token_collapse)
TEXT_RULES: tuple[TextRule, ...] = (empty, non_text, symbol_soup)


def check(text: str, token_ids: Sequence[int] | None = None) -> list[Finding]:
    """Every rule's finding for one output. Token rules use ``token_ids`` when the
    server returned them. Without ids the loop rule runs on characters (a loop is a
    loop in either; its thresholds then count characters) and the collapse rule is
    skipped: any text uses only a few dozen distinct characters."""
    if token_ids is not None:
        found = [f for rule in TOKEN_RULES if (f := rule(token_ids)) is not None]
    else:
        found = [f for f in (repetition_loop(text),) if f is not None]
    found += [f for rule in TEXT_RULES if (f := rule(text)) is not None]
    return found
