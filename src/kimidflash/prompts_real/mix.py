"""heldout-mix and its per-set parts, drawn from the evaluation sets, and every set at once.

Kept apart from `sets.py` (which reads each source into its set) because the mix is a
selection over sets already read: the same records whichever sets a machine could read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..drawn import drawn
from ..errors import RealPromptsError
from .humaneval import read_problems
from .longctx import NAME as LONG
from .longctx import long_set
from .sets import (
    FORMAT,
    MIX_OF,
    MIX_PER_SET,
    SALT,
    PromptSet,
    bigbench_sets,
    category_counts,
    deal,
    humaneval_set,
    mtbench_set,
)
from .sources import HUMANEVAL


def _picked(sets: Mapping[str, PromptSet], names: tuple[str, ...], per_set: int, salt: str) -> dict[str, list]:
    """heldout-mix's records of each set in `names`, in the order it takes them."""
    if per_set < 1:
        raise RealPromptsError(f"heldout-mix: per_set must be at least 1, not {per_set}")
    picked: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        records = sets[name].records
        ordered = deal(records) if name == "bigbench-heldout" else drawn(records, lambda r: str(r["id"]), salt)
        picked[name] = [{**r, "set": name} for r in ordered[:per_set]]
    return picked


def mix_parts(sets: Mapping[str, PromptSet], per_set: int = MIX_PER_SET, salt: str = SALT) -> dict[str, PromptSet]:
    """`heldout-mix-<set>` for each set of `MIX_OF` in `sets`: exactly the records heldout-mix takes
    from it (each set's draw is its own, so a part needs no other set), for a report per source."""
    names = tuple(n for n in MIX_OF if n in sets)
    parts: dict[str, PromptSet] = {}
    for name, records in _picked(sets, names, per_set, salt).items():
        part = f"heldout-mix-{name}"
        parts[part] = PromptSet(
            part,
            "eval",
            records,
            {
                "set": part,
                "purpose": "eval",
                "format": sets[name].manifest["format"] + "; each also names its `set`",
                "source": sets[name].manifest["source"],
                "selection": {"of": "heldout-mix", "set": name, "per_set": per_set, "salt": salt},
                "note": "evaluation only: heldout-mix's records from one set, in its order",
                "prompts": len(records),
                "categories": category_counts(records),
            },
        )
    return parts


def mix_set(sets: Mapping[str, PromptSet], per_set: int = MIX_PER_SET, salt: str = SALT) -> PromptSet:
    """`heldout-mix`: up to `per_set` records of each set in `MIX_OF`, interleaved set by set.

    BIG-bench's are its first in round-robin order over held-out tasks (so every task before any
    twice); HumanEval's and MT-bench's the first by sha256(salt:id), a draw that is the same on every
    machine. Each record keeps its kind and gains `set`, so a report can still be split by source."""
    missing = [n for n in MIX_OF if n not in sets]
    if missing:
        raise RealPromptsError(f"heldout-mix needs the sets {', '.join(missing)}")
    picked = _picked(sets, MIX_OF, per_set, salt)
    records = [q[i] for i in range(per_set) for q in picked.values() if i < len(q)]
    return PromptSet(
        "heldout-mix",
        "eval",
        records,
        {
            "set": "heldout-mix",
            "purpose": "eval",
            "format": FORMAT + " (MT-bench's with both turns); each also names its `set`",
            "sources": {n: {**sets[n].manifest["source"], "prompts": len(picked[n])} for n in MIX_OF},
            "canary": sets["bigbench-heldout"].manifest.get("canary", []),
            "selection": {
                "per_set": per_set,
                "salt": salt,
                "order": "interleaved set by set",
                "bigbench-heldout": "first in round-robin order over its tasks",
                "humaneval, mt-bench": "first by sha256(salt:id)",
            },
            "note": "evaluation only: every record is from a set never trained on",
            "prompts": len(records),
            "categories": category_counts(records),
        },
    )


def build_sets(
    bigbench_archive: str | Path | None = None,
    humaneval_wheel: str | Path | None = None,
    mtbench_wheel: str | Path | None = None,
    *,
    bigbench: bool = True,
) -> dict[str, PromptSet]:
    """Every set, heldout-mix, its parts and humaneval-long; without `bigbench`, all but BIG-bench's
    sets and heldout-mix itself (which needs all three)."""
    wheel = Path(humaneval_wheel) if humaneval_wheel is not None else HUMANEVAL.fetch()
    sets = {s.name: s for s in (humaneval_set(wheel), mtbench_set(mtbench_wheel))}
    if bigbench:
        sets = {s.name: s for s in bigbench_sets(bigbench_archive)} | sets
        sets["heldout-mix"] = mix_set(sets)
    parts = mix_parts(sets)
    return sets | parts | {LONG: long_set(read_problems(wheel), parts["heldout-mix-humaneval"])}
