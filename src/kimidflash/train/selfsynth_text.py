"""What makes a synthesised user turn usable, and how diverse a set of them is (standard library only).

The target writes its own user requests (Magpie: an aligned model given only its chat template's
user prefix writes a request), so nothing here knows what a good request is. It refuses what a
drafter should not learn from: requests too short or too long, text that is mostly not Latin
script (the held-out prompts people wrote are English), repetition loops (a sampled turn that
repeats one phrase until max_tokens), exact and near duplicates, and anything sharing a long
n-gram with the evaluation sets (contamination).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def normalized(text: str) -> str:
    """Case, accents, punctuation and spacing folded: two requests equal here are one request."""
    text = unicodedata.normalize("NFKD", text)
    return " ".join(words("".join(c for c in text if not unicodedata.combining(c))))


@dataclass(frozen=True)
class Limits:
    """A synthesised turn's bounds (the manifest records them)."""

    min_words: int = 4
    max_words: int = 200
    min_latin: float = 0.9  # share of letters that are Latin script
    max_repeat: float = 0.5  # share of word 3-grams that repeat an earlier one


def latin_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    return sum(1 for c in letters if "LATIN" in unicodedata.name(c, "")) / len(letters)


def repeat_share(ws: list[str], n: int = 3) -> float:
    """The share of n-grams seen before in the same text: near 0 for prose, near 1 for a loop."""
    grams = [tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)]
    if not grams:
        return 0.0
    return 1 - len(set(grams)) / len(grams)


def refusal(text: str, limits: Limits) -> str | None:
    """Why a turn is refused (the manifest counts each reason), or None."""
    ws = words(text)
    if len(ws) < limits.min_words:
        return "too_short"
    if len(ws) > limits.max_words:
        return "too_long"
    if latin_share(text) < limits.min_latin:
        return "language"
    if repeat_share(ws) > limits.max_repeat:
        return "repetition"
    return None


class NearDuplicates:
    """MinHash over word 5-gram shingles with banded LSH: a text whose estimated Jaccard similarity
    to one already kept reaches `threshold` (about 0.8 with 16 bands of 4 rows) is a near duplicate.
    Exact duplicates (equal after `normalized`) are caught first, by hash."""

    def __init__(self, bands: int = 16, rows: int = 4, shingle: int = 5):
        self.bands, self.rows, self.shingle = bands, rows, shingle
        self.exact: set[str] = set()
        self.buckets: list[dict[str, int]] = [{} for _ in range(bands)]
        self.kept = 0

    def _signature(self, ws: list[str]) -> list[int]:
        n = self.shingle
        shingles = {" ".join(ws[i : i + n]) for i in range(max(1, len(ws) - n + 1))}
        return [
            min(int.from_bytes(hashlib.blake2b(f"{k}:{s}".encode(), digest_size=8).digest(), "big") for s in shingles)
            for k in range(self.bands * self.rows)
        ]

    def check(self, text: str) -> str | None:
        """'exact_duplicate', 'near_duplicate', or None; a text that passes is remembered."""
        norm = normalized(text)
        key = hashlib.sha256(norm.encode()).hexdigest()
        if key in self.exact:
            return "exact_duplicate"
        sig = self._signature(norm.split())
        bands = [
            hashlib.blake2b(repr(sig[b * self.rows : (b + 1) * self.rows]).encode(), digest_size=8).hexdigest()
            for b in range(self.bands)
        ]
        if any(h in bucket for h, bucket in zip(bands, self.buckets, strict=True)):
            return "near_duplicate"
        self.exact.add(key)
        for h, bucket in zip(bands, self.buckets, strict=True):
            bucket[h] = self.kept
        self.kept += 1
        return None


class Contamination:
    """Every word n-gram (13 by default, as in the GPT-3 and Llama decontamination reports) of the
    evaluation sets; a text sharing one with them is contaminated."""

    def __init__(self, texts: Iterable[str], n: int = 13):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.sources = 0
        for t in texts:
            ws = words(t)
            self.grams.update(tuple(ws[i : i + n]) for i in range(len(ws) - n + 1))
            self.sources += 1

    def hits(self, text: str) -> int:
        ws = words(text)
        return sum(1 for i in range(len(ws) - self.n + 1) if tuple(ws[i : i + self.n]) in self.grams)


@dataclass
class Diversity:
    """Distinct n-gram ratios (distinct-n: unique n-grams over all n-grams) and topic spread (the share
    of texts taken by the most common first two words, and how many distinct ones there are)."""

    texts: int = 0
    distinct: dict[int, float] = field(default_factory=dict)
    openings: int = 0
    top_opening_share: float = 0.0

    @classmethod
    def of(cls, texts: list[str], ns: tuple[int, ...] = (1, 2, 3)) -> Diversity:
        tokenised = [words(t) for t in texts]
        distinct = {}
        for n in ns:
            grams = Counter(tuple(ws[i : i + n]) for ws in tokenised for i in range(len(ws) - n + 1))
            total = sum(grams.values())
            distinct[n] = round(len(grams) / total, 4) if total else 0.0
        openings = Counter(" ".join(ws[:2]) for ws in tokenised if ws)
        top = openings.most_common(1)[0][1] / len(texts) if texts and openings else 0.0
        return cls(len(texts), distinct, len(openings), round(top, 4))
