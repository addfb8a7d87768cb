"""`kimidflash ab --category`: per-category A/B in the manner of SpecBench, against the fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimidflash.bench import load_result
from kimidflash.bench.categories import ALL, parse_categories, specbench
from kimidflash.bench.prompts import load_source, of_kind
from kimidflash.errors import PromptError

from ..support.helpers import command
from .test_train_ab import argv


def _write(path: Path, kinds: list[str]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"{k}-{i}", "kind": k, "turns": [f"question {i} about {k}"]}) + "\n"
            for i, k in enumerate(kinds)
        )
    )
    return path


@pytest.fixture
def sets(tmp_path: Path) -> tuple[Path, Path]:
    return (
        _write(tmp_path / "mixed.jsonl", ["code", "math", "code", "math", "math"]),
        _write(tmp_path / "he.jsonl", ["code"] * 3),
    )


def test_categories_split_by_kind_only_where_a_file_has_several_and_multi_turn_comes_last(sets):
    mixed, he = sets
    cats = parse_categories([f"bb={mixed}", f"he={he}"], by_kind=True, multi_turn=["bb=3"])
    assert [(c.name, c.kind, c.turns) for c in cats] == [
        ("bb/code", "code", 1),
        ("bb/math", "math", 1),
        ("he", None, 1),
        ("bb multi-turn", None, 3),
    ]
    assert [c.slug for c in cats] == ["bb-code", "bb-math", "he", "bb-multi-turn"]
    assert [c.name for c in parse_categories([f"bb={mixed}"])] == ["bb"]


def test_kind_keeps_the_kinds_named_and_names_a_lone_one_by_its_kind(sets):
    """`--kind` (an expensive kind left for later, as acceptance-by-length.sh's 18 k budget): only
    those kinds run, each as NAME/kind even where one is left, so its files read as the others'."""
    mixed, he = sets
    cats = parse_categories([f"bb={mixed}", f"he={he}"], by_kind=True, only_kinds=["math"])
    assert [(c.name, c.kind, c.slug) for c in cats] == [("bb/math", "math", "bb-math")]
    cats = parse_categories([f"bb={mixed}", f"he={he}"], by_kind=True, only_kinds=["code"])
    assert [c.name for c in cats] == ["bb/code", "he/code"]
    with pytest.raises(ValueError, match="--kind prose: no --category file holds it; they hold code, math"):
        parse_categories([f"bb={mixed}"], by_kind=True, only_kinds=["prose"])
    with pytest.raises(ValueError, match="--kind picks kinds of a --by-kind split"):
        parse_categories([f"bb={mixed}"], only_kinds=["code"])


@pytest.mark.parametrize(
    "specs, multi, message",
    [
        (["bb"], [], "--category bb: expected NAME=VALUE"),
        (["bb=/nonexistent.jsonl"], [], "--category bb: "),
        (["a/b={mixed}"], [], "may not hold '/'"),
        (["bb={mixed}", "bb={he}"], [], "--category bb: given twice"),
        (["bb={mixed}"], ["he=3"], "--multi-turn he=3: no --category is named 'he'"),
        (["bb={mixed}"], ["bb=1"], "the number of turns must be 2 or more"),
    ],
)
def test_bad_categories_are_one_clear_error(sets, specs, multi, message):
    mixed, he = sets
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_categories([s.format(mixed=mixed, he=he) for s in specs], multi_turn=multi)


def test_a_kind_the_source_lacks_names_the_kinds_it_has(sets):
    convs = load_source(str(sets[0]))
    assert [c.id for c in of_kind(convs, "code")] == ["code-0", "code-2"]
    with pytest.raises(PromptError, match="no prompts of kind 'prose'; the source has code, math"):
        of_kind(convs, "prose")


def test_ab_runs_every_category_per_variant_and_specbench_pools_the_rounds(
    fake_serving, drafter, sets, tmp_path, capsys
):
    mixed, he = sets
    walk = tmp_path / "eval-he.json"
    walk.write_text(
        json.dumps({"by_k": {"3": {"mean_acceptance_length": 1.9, "walk": {"mean_acceptance_length": 1.7}}}})
    )
    out = tmp_path / "ab"
    base = [a for a in argv(out, drafter) if a != "--offline" and not a.endswith("offline-acceptance.json")]
    assert (
        command(
            "ab",
            base
            + [
                "--concurrency",
                "1",
                "--category",
                f"bb={mixed}",
                "--category",
                f"he={he}",
                "--by-kind",
                "--multi-turn",
                "bb=2",
                "--rounds",
                "2",
                "--offline-category",
                f"mine@he={walk}",
            ],
        )
        == 0
    )
    assert len(fake_serving) == 4  # each variant served once per round, every category on that one server
    cats = ["bb-code", "bb-math", "he", "bb-multi-turn"]
    assert sorted(p.name for p in out.glob("*-r*.json")) == sorted(
        f"{v}-{c}-c1-r{r}.json" for v in ("mine-k3", "no-speculation") for c in cats for r in (1, 2)
    )
    doc = load_result(out / "mine-k3-bb-math-c1-r2.json")
    assert doc["config"]["category"] == "bb/math" and doc["config"]["kind"] == "math"
    assert load_result(out / "no-speculation-bb-multi-turn-c1-r1.json")["turns_per_session"] == 2
    table = json.loads((out / "specbench.json").read_text())
    rows = {r["category"]: r for r in table["rows"]}
    assert list(rows) == ["bb/code", "bb/math", "bb (all kinds)", "he", "bb multi-turn", ALL]
    assert rows["bb (all kinds)"]["members"] == ["bb/code", "bb/math"]
    assert rows[ALL]["members"] == ["bb/code", "bb/math", "he"]  # multi-turn sessions are not pooled with single turns

    def pooled(slugs: list[str], variant: str) -> float:
        docs = [load_result(out / f"{variant}-{s}-c1-r{r}.json") for s in slugs for r in (1, 2)]
        return sum(d["total_output_tokens"] for d in docs) / sum(d["duration"] for d in docs)

    def decoded(slugs: list[str], variant: str) -> float:
        reqs = [
            q
            for s in slugs
            for r in (1, 2)
            for q in load_result(out / f"{variant}-{s}-c1-r{r}.json")["requests"]
            if q["output_tokens"] > 1
        ]
        assert reqs
        return sum(q["output_tokens"] - 1 for q in reqs) / sum((q["e2el_ms"] - q["ttft_ms"]) / 1e3 for q in reqs)

    for name, slugs in (
        ("he", ["he"]),
        ("bb (all kinds)", ["bb-code", "bb-math"]),
        (ALL, ["bb-code", "bb-math", "he"]),
    ):
        cell = rows[name]["series"]["mine k=3"]
        assert cell["speedup"] == pytest.approx(pooled(slugs, "mine-k3") / pooled(slugs, "no-speculation"))
        assert cell["acceptance_length"] == pytest.approx(2.5) and cell["runs"] == 2 * len(slugs)
        assert cell["decode_speedup"] == pytest.approx(decoded(slugs, "mine-k3") / decoded(slugs, "no-speculation"))
        docs = [load_result(out / f"mine-k3-{s}-c1-r{r}.json") for s in slugs for r in (1, 2)]
        assert cell["drafted_per_draft"] == pytest.approx(
            sum(d["spec_decode_draft_tokens"] for d in docs) / sum(d["spec_decode_num_drafts"] for d in docs)
        )
    assert rows["he"]["series"]["mine k=3"]["offline_walk_acceptance_length"] == 1.7
    assert rows["bb/code"]["series"]["mine k=3"]["offline_walk_acceptance_length"] is None
    md = (out / "specbench.md").read_text()
    assert "| he | 1 |" in md and "| 1.70 |" in md
    assert (out / "report-bb-code.md").is_file() and (out / "report-bb-multi-turn.md").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompts", "x.jsonl", "--category", "bb={mixed}"], "give --prompts or --category, not both"),
        (["--by-kind"], "--by-kind, --kind, --multi-turn and --offline-category work on --category files"),
        (["--category", "bb={mixed}", "--offline-category", "mine=x.json"], "expected LABEL@CATEGORY=FILE"),
    ],
)
def test_bad_ab_categories_are_one_clear_error(fake_serving, drafter, sets, tmp_path, capsys, extra, message):
    assert command("ab", argv(tmp_path / "ab", drafter, *[e.format(mixed=sets[0]) for e in extra])) == 2
    assert message in capsys.readouterr().err and not fake_serving


def test_specbench_needs_its_baseline(tmp_path):
    with pytest.raises(ValueError, match="no result files for the baseline 'none'"):
        specbench([], "none")
