"""Generate the config reference from the schema into README.md and docs/.

The generated table sits between markers, so prose around it stays
hand-written while the table can never disagree with the schema
(tests/test_docs.py fails when it does).
"""

from __future__ import annotations

from pathlib import Path

from .config.schema import FIELDS, GROUPS
from .paths import REPO_ROOT

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
TARGETS = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "configuration.md")


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else "(empty)"


def reference_table() -> str:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for group in GROUPS:
        for f in (f for f in FIELDS if f.group == group):
            rows.append(f"| `{f.name}` | {f.describe_type()} | {_default(f.default)} | {f.doc} |")
    return "\n".join(rows)


def splice(text: str, table: str, where: Path) -> str:
    if START not in text or END not in text:
        raise ValueError(f"{where} has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def stale(targets: tuple[Path, ...] = TARGETS) -> list[Path]:
    table = reference_table()
    return [p for p in targets if splice(p.read_text(), table, p) != p.read_text()]


def write(targets: tuple[Path, ...] = TARGETS) -> list[Path]:
    table = reference_table()
    changed = []
    for p in targets:
        new = splice(p.read_text(), table, p)
        if new != p.read_text():
            p.write_text(new)
            changed.append(p)
    return changed
