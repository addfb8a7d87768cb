"""`humaneval-long`: HumanEval questions asked after a module of other problems' code, at several
context lengths, for acceptance by context length.

Why: Kimi K2.6 serves 256K-token contexts, the K2.5 drafter was trained on 4K, and this project's
drafters on prompts under 512 tokens. What the acceptance does with length needs prompts people
wrote at the lengths a served context reaches, with nothing else changing. So each question of
heldout-mix's HumanEval part is asked once per context budget (`CONTEXT_CHARS`), after a module
made of other problems' signatures, docstrings and canonical solutions (code people wrote), added
whole in an order drawn by sha256(salt:question:problem) until the next would pass the budget.
The question and what it asks for stay the same; only what precedes it grows.

Each record's kind is its budget (`ctx-00k` ... `ctx-18k`, thousands of characters, padded so that
they sort by length): `kimidflash ab --category long=FILE --by-kind` reports acceptance per
budget, and the per-request spec-decode stats bucket every request by its served prompt tokens
(`bench/lengths.py`). Evaluation only, as HumanEval is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..drawn import drawn, leading_within
from ..errors import RealPromptsError
from .humaneval import CHAT_PROMPT, Problem
from .sets import FORMAT, SALT, PromptSet, category_counts

NAME = "humaneval-long"
CONTEXT_CHARS = (0, 3000, 9000, 18000)  # SmolLM2 reads Python at about 3 characters a token
QUESTIONS = 12
LONG_PROMPT = (
    "Here is a Python module we are writing:\n\n```python\n{context}\n```\n\n"
    "Complete this Python function for it:\n\n```python\n{code}\n```"
)


def kind(budget: int) -> str:
    """`ctx-09k` for 9,000 characters: a category name that sorts by length."""
    return f"ctx-{budget // 1000:02d}k"


def module_for(question: Problem, problems: Sequence[Problem], budget: int, salt: str = SALT) -> list[Problem]:
    """The other problems that make `question`'s context: whole, in their drawn order, while the
    module (blocks joined by a blank line) stays within `budget` characters."""
    others = [p for p in problems if p.task_id != question.task_id]
    others = drawn(others, lambda p: f"{question.task_id}:{p.task_id}", salt)
    return leading_within(others, lambda p: len(_block(p)), budget, joiner=2)


def _block(p: Problem) -> str:
    return (p.code + p.solution).rstrip()


def long_set(
    problems: Sequence[Problem],
    part: PromptSet,
    questions: int = QUESTIONS,
    budgets: Sequence[int] = CONTEXT_CHARS,
    salt: str = SALT,
) -> PromptSet:
    """One record per budget and question (the first `questions` of `part`, heldout-mix's HumanEval
    records), grouped by budget; `problems` are all of HumanEval's, with their solutions."""
    question_ids = [str(r["task"]) for r in part.records[:questions]]
    by_id = {p.task_id: p for p in problems}
    missing = [t for t in question_ids if t not in by_id]
    if missing:
        raise RealPromptsError(f"{NAME}: no HumanEval problem {missing[0]}")
    if not question_ids:
        raise RealPromptsError(f"{NAME}: no questions to ask")
    records: list[dict[str, Any]] = []
    for budget in budgets:
        if budget < 0:
            raise RealPromptsError(f"{NAME}: a context budget must be at least 0 characters, not {budget}")
        for tid in question_ids:
            q = by_id[tid]
            module = module_for(q, problems, budget, salt)
            context = "\n\n".join(_block(p) for p in module)
            code = q.code.rstrip()
            text = LONG_PROMPT.format(context=context, code=code) if module else CHAT_PROMPT.format(code=code)
            records.append(
                {
                    "id": f"{q.id}@{kind(budget)}",
                    "kind": kind(budget),
                    "source": part.manifest["source"]["requirement"],
                    "task": q.task_id,
                    "entry_point": q.entry_point,
                    "context_problems": [p.task_id for p in module],
                    "context_chars": len(context),
                    "turns": [text],
                }
            )
    return PromptSet(
        NAME,
        "eval",
        records,
        {
            "set": NAME,
            "purpose": "eval",
            "format": FORMAT + "; each also gives its context_problems and context_chars",
            "source": part.manifest["source"],
            "questions": list(question_ids),
            "context_chars": list(budgets),
            "long_prompt": LONG_PROMPT,
            "chat_prompt": CHAT_PROMPT,
            "selection": {
                "questions": "heldout-mix's HumanEval records, first in its order",
                "context": "other problems' prompt + canonical_solution, whole, by sha256(salt:question:problem)",
                "salt": salt,
            },
            "note": "evaluation only: the same questions at each context budget (kind)",
            "prompts": len(records),
            "categories": category_counts(records),
        },
    )
