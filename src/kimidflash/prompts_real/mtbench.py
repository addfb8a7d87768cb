"""MT-bench's 80 two-turn questions, read from the flexeval wheel (a zip), never installed.

MT-bench (lm-sys FastChat's `llm_judge/data/mt_bench/question.jsonl`) is the
multi-turn set SpecBench draws its conversation category from: ten questions in
each of eight categories (writing, roleplay, reasoning, math, coding,
extraction, stem, humanities), each with a second turn that people wrote to
follow the first. The flexeval wheel ships an unchanged copy as
`chatbot_bench_datasets/mt-en.jsonl` (its README there names the source).
Evaluation only, like HumanEval: `sets.training_prompts` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import RealPromptsError
from .wheel import jsonl_records

MEMBER = "flexeval/core/chat_dataset/chatbot_bench_datasets/mt-en.jsonl"


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"mt-bench/{self.question_id}"


def read_questions(wheel: str | Path) -> list[Question]:
    """The questions in file order; every one must have a category and two or more non-empty turns."""
    out: list[Question] = []
    for where, obj in jsonl_records(wheel, MEMBER):
        try:
            q = Question(int(obj["question_id"]), str(obj["category"]), tuple(str(t) for t in obj["turns"]))
        except (KeyError, TypeError, ValueError) as e:
            raise RealPromptsError(f"{where}: not an MT-bench question ({e})") from None
        if len(q.turns) < 2 or not all(t.strip() for t in q.turns) or not q.category:
            raise RealPromptsError(f"{where}: an MT-bench question has a category and two turns")
        out.append(q)
    if not out:
        raise RealPromptsError(f"{wheel}:{MEMBER}: no questions")
    return out
