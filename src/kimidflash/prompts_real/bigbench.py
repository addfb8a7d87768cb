"""BIG-bench tasks read straight from the bigbench sdist (a tar.gz), never installed.

A *task* is a folder directly under `bigbench/benchmark_tasks/`; its subtasks
(subfolders with their own task.json, e.g. `arithmetic/2_digit_addition`) belong
to it, so splits by task keep every subtask on one side. Folders with a task.py
and no task.json are programmatic tasks (their examples are made by code we do
not run): they are skipped and counted.

A prompt is one example's `input`, rendered for a chat model:

    [task_prefix]\\n\\n<input>[\\n\\nOptions:\\n- <choice>...]

the task's own instruction first (when it has one), then the input, then the
multiple-choice answers (the keys of `target_scores`, in file order) unless the
task sets `append_choices_to_input: false`. Prompts whose input is not a string
or is empty (unless the instruction and the options alone ask the question, as
in cause_and_effect), whose rendering is longer than `max_chars`, or that repeat an earlier
prompt (whitespace-folded, tasks in name order) are dropped; then each task keeps
at most `per_task` prompts, chosen by a salted hash of the prompt id (a stable
sample across its subtasks), so a few giant tasks do not dominate.

The category comes from the task's BIG-bench keywords (`CATEGORY_RULES`): the
first rule that shares a keyword wins, else "other".
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RealPromptsError

TASKS_DIR = "/bigbench/benchmark_tasks/"

# First match wins, in this order; keyword spellings as in BIG-bench's keywords.md.
CATEGORY_RULES: tuple[tuple[str, frozenset[str]], ...] = (
    ("code", frozenset({"computer code", "algorithms", "semantic parsing"})),
    ("math", frozenset({"mathematics", "arithmetic", "algebra", "mathematical proof", "probabilistic reasoning"})),
    (
        "language",
        frozenset(
            {
                "translation",
                "multilingual",
                "non-English",
                "low-resource language",
                "linguistics",
                "morphology",
                "syntax",
                "grammar",
                "paraphrase",
                "word sense disambiguation",
                "tokenization",
                "summarization",
                "text simplification",
                "figurative language",
            }
        ),
    ),
    (
        "knowledge",
        frozenset(
            {
                "context-free question answering",
                "contextual question-answering",
                "reading comprehension",
                "domain specific",
                "medicine",
                "chemistry",
                "biology",
                "physics",
                "truthfulness",
                "memorization",
                "sufficient information",
            }
        ),
    ),
    (
        "reasoning",
        frozenset(
            {
                "logical reasoning",
                "analogical reasoning",
                "causal reasoning",
                "implicit reasoning",
                "multi-step",
                "decomposition",
                "fallacy",
                "negation",
                "visual reasoning",
                "physical reasoning",
                "theory of mind",
                "social reasoning",
                "common sense",
                "game play",
            }
        ),
    ),
)
OTHER = "other"  # creativity, humour, dialogue and whatever no rule names
CATEGORIES: tuple[str, ...] = tuple(c for c, _ in CATEGORY_RULES) + (OTHER,)
CAP_SALT = "kimidflash-bigbench-cap-v1"


def category(keywords: list[str] | tuple[str, ...]) -> str:
    kws = set(keywords)
    for name, rule in CATEGORY_RULES:
        if kws & rule:
            return name
    return OTHER


@dataclass(frozen=True)
class Prompt:
    id: str  # bigbench/<task>[/<subtask>]/<example index in its task.json>
    text: str


@dataclass
class Task:
    name: str
    keywords: tuple[str, ...]
    category: str
    subtasks: tuple[str, ...]
    examples: int  # examples in its task.json files, before any filter
    prompts: list[Prompt]
    canary: str = ""


@dataclass
class Catalog:
    tasks: dict[str, Task]  # only tasks left with at least one prompt, by name
    programmatic: list[str] = field(default_factory=list)  # task.py, no task.json
    no_prompts: list[str] = field(default_factory=list)  # task.json but every prompt dropped
    dropped: dict[str, int] = field(default_factory=dict)  # prompts by reason
    files: int = 0  # task.json files read


@dataclass
class _File:
    keywords: list[str]
    canary: str
    examples: int
    texts: list[tuple[int, str]]  # (example index, rendered text) that passed the per-prompt filters


def render(task: dict[str, Any], example: dict[str, Any]) -> str:
    """One example as a chat prompt (module docstring); "" when it asks nothing: an empty
    input is kept only where the task's instruction and the options make the question
    (e.g. cause_and_effect: "which sentence makes more sense?" over two sentences)."""
    text = example["input"].strip()
    prefix = task.get("task_prefix")
    prefix = prefix.strip() if isinstance(prefix, str) else ""
    scores = example.get("target_scores")
    options = ""
    if isinstance(scores, dict) and scores and task.get("append_choices_to_input", True) is not False:
        options = "Options:\n" + "\n".join(f"- {str(c).strip()}" for c in scores)
    if not text and not (prefix and options):
        return ""
    return "\n\n".join(p for p in (prefix, text, options) if p)


def _read_file(raw: bytes, where: str, max_chars: int, dropped: dict[str, int]) -> _File:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RealPromptsError(f"{where}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise RealPromptsError(f"{where}: not a JSON object")
    kws = data.get("keywords")
    keywords = [k for k in kws if isinstance(k, str)] if isinstance(kws, list) else []
    examples = data.get("examples")
    examples = examples if isinstance(examples, list) else []  # a parent of subtasks has none
    texts: list[tuple[int, str]] = []
    for i, ex in enumerate(examples):
        if not isinstance(ex, dict) or not isinstance(ex.get("input"), str):
            dropped["not_text"] = dropped.get("not_text", 0) + 1
            continue
        text = render(data, ex)
        reason = "empty" if not text else "too_long" if len(text) > max_chars else None
        if reason:
            dropped[reason] = dropped.get(reason, 0) + 1
        else:
            texts.append((i, text))
    return _File(keywords, str(data.get("canary", "")), len(examples), texts)


def _cap_rank(pid: str) -> str:
    return hashlib.sha256(f"{CAP_SALT}:{pid}".encode()).hexdigest()


def cap(prompts: list[Prompt], per_task: int) -> list[Prompt]:
    """At most `per_task` of a task's prompts: the first by a salted hash of their ids, kept in file
    order, so a smaller cap always keeps a subset of a larger one."""
    if len(prompts) <= per_task:
        return list(prompts)
    keep = {p.id for p in sorted(prompts, key=lambda p: _cap_rank(p.id))[:per_task]}
    return [p for p in prompts if p.id in keep]


def read_catalog(archive: str | Path, *, max_chars: int = 2000, per_task: int = 32) -> Catalog:
    """Every task.json in the sdist at `archive`, filtered and capped (module docstring)."""
    dropped: dict[str, int] = {"not_text": 0, "empty": 0, "too_long": 0, "duplicate": 0, "over_cap": 0}
    files: dict[str, dict[str, _File]] = {}  # task -> subtask path ("" for its own task.json) -> file
    folders: dict[str, set[str]] = {}  # task -> names of the files directly in it
    try:
        with tarfile.open(archive, "r|gz") as tf:  # one pass over the stream
            for m in tf:
                at = m.name.find(TASKS_DIR)
                if at < 0:
                    continue
                parts = m.name[at + len(TASKS_DIR) :].split("/")
                if len(parts) < 2 or not parts[0]:
                    continue
                folders.setdefault(parts[0], set()).add(parts[1] if len(parts) == 2 else "")
                if parts[-1] != "task.json" or not m.isfile():
                    continue
                f = tf.extractfile(m)
                if f is None:
                    continue
                sub = "/".join(parts[1:-1])
                files.setdefault(parts[0], {})[sub] = _read_file(f.read(), m.name, max_chars, dropped)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise RealPromptsError(f"{archive}: not a readable tar.gz ({e})") from None
    if not files:
        raise RealPromptsError(f"{archive}: no {TASKS_DIR}*/task.json inside")
    cat = Catalog(tasks={}, dropped=dropped, files=sum(len(v) for v in files.values()))
    cat.programmatic = sorted(t for t, names in folders.items() if t not in files and "task.py" in names)
    seen: set[str] = set()
    for name in sorted(files):
        subs = files[name]
        root = subs.get("")
        keywords = root.keywords if root and root.keywords else sorted({k for f in subs.values() for k in f.keywords})
        prompts: list[Prompt] = []
        for sub in sorted(subs):
            for i, text in subs[sub].texts:
                key = " ".join(text.split())
                if key in seen:
                    dropped["duplicate"] += 1
                    continue
                seen.add(key)
                prompts.append(Prompt(f"bigbench/{name}/{sub + '/' if sub else ''}{i}", text))
        dropped["over_cap"] += max(0, len(prompts) - per_task)
        prompts = cap(prompts, per_task)
        if not prompts:
            cat.no_prompts.append(name)
            continue
        canary = next((f.canary for f in ([root] if root else []) + list(subs.values()) if f.canary), "")
        cat.tasks[name] = Task(
            name,
            tuple(keywords),
            category(keywords),
            tuple(s for s in sorted(subs) if s),
            sum(f.examples for f in subs.values()),
            prompts,
            canary,
        )
    return cat
