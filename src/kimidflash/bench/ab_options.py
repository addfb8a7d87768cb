"""What one `kimidflash ab` run is asked to do, as one typed value (a leaf module).

`ab_cli.py` builds it from the command line; `ab.py` and the shipped-schedule check
read its attributes, so the type checker follows a renamed or retyped option to every
reader. The defaults are the command line's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class AbOptions:
    serve_config: Path
    out: str
    drafter: list[str] = field(default_factory=list)  # LABEL=DIR, the family read from DIR/config.json
    ngram: bool = False
    none: bool = False
    as_shipped: bool = False
    k: list[int] | None = None  # None: DEFAULT_K for --drafter and --ngram
    ngram_k: list[int] | None = None  # None: k
    prompts: str | None = None  # None: the built-in set
    category: list[str] = field(default_factory=list)  # NAME=FILE
    by_kind: bool = False
    kind: list[str] = field(default_factory=list)  # with by_kind: only these kinds
    multi_turn: list[str] = field(default_factory=list)  # NAME=N
    workload: list[str] = field(default_factory=lambda: ["free"])
    sessions: int = 16
    turns: int = 1
    concurrency: list[int] = field(default_factory=lambda: [1, 8])
    max_tokens: int = 128
    temperature: float = 0.0
    warmup: int = 2
    seed: int = 0
    ignore_eos: bool = False
    set: list[str] = field(default_factory=list)  # KEY=VALUE, given to every variant
    reuse: bool = False
    rounds: int = 1
    interleave: bool = False
    offline: list[str] = field(default_factory=list)  # [LABEL=]FILE
    offline_category: list[str] = field(default_factory=list)  # LABEL@CATEGORY=FILE
