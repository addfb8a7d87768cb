"""THE Markdown table: every report this package writes (compare, the sweep, the A/B, the FP8
validation, the category breakdown, the generated docs) lays its tables out here, so a change of
layout (alignment, escaping) is made once and no two reports disagree on it.

A leaf module (stdlib only): any package may use it without importing another.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def escape(cell: str) -> str:
    """A cell whose own `|` must not end it (GitHub reads `\\|` as the character, also in code spans)."""
    return cell.replace("|", "\\|")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: Collection[int] = ()) -> list[str]:
    """The lines of a GitHub Markdown table: the header row, the rule (columns in `right` right-aligned,
    for numbers) and one line per row. Cells are written as given (`str()` of each): escaping is the
    caller's choice, since a cell may hold Markdown of its own."""
    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(headers)))
    return [row(headers), rule, *(row(r) for r in rows)]


def row(cells: Sequence[object]) -> str:
    """One table line: for a caller that writes rows between other lines."""
    return "| " + " | ".join(str(c) for c in cells) + " |"
