"""Orders drawn from sha256: which tasks are held out, which records heldout-mix takes, which texts
fill a long prompt's context.

A draw from a salted hash is the same on every machine, Python version and run (unlike `random`
seeded or `hash()` randomised per process), and adding an item never reorders the others: a split
or a long prompt written by one session is the one the next session rebuilds. A leaf module
(stdlib only) so the prompt sets and the training data share one definition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def drawn(items: Iterable[T], key: Callable[[T], str], salt: str) -> list[T]:
    """`items` sorted by sha256 of `salt:key(item)`."""
    return sorted(items, key=lambda item: hashlib.sha256(f"{salt}:{key(item)}".encode()).hexdigest())


def leading_within(items: Iterable[T], size: Callable[[T], int], budget: int, joiner: int = 0) -> list[T]:
    """The leading items, whole, while their sizes (and `joiner` between two of them) add up to no
    more than `budget`: the first that does not fit ends the list, so no item is cut or skipped."""
    out: list[T] = []
    total = 0
    for item in items:
        n = size(item) + (joiner if out else 0)
        if total + n > budget:
            break
        out.append(item)
        total += n
    return out
