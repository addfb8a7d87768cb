"""Where a result came from: enough to reproduce it or to distrust it.

Tool version and git revision (with a dirty flag) say which code measured;
the server's `/version` and `/v1/models` say what was measured; the recipe
config file and its sha256 say how the server was launched, when it was
launched by the recipe; host and UTC time say where and when. Paths are
recorded portable (paths.portable): repo-relative, `$KIMIDFLASH_CACHE/...`,
`~/...`, never this machine's checkout or home.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import load_config
from ..fsio import git_info, utc_now
from ..hostinfo import cpu_kind
from ..paths import REPO_ROOT, portable, portable_argv

# Recipe config keys that describe the served deployment (never secrets).
RECIPE_KEYS = (
    "PLATFORM",
    "RUNTIME",
    "VLLM_VERSION",
    "VLLM_IMAGE",
    "SERVED_MODEL_NAME",
    "MODEL_DIR",
    "DRAFT_MODEL_DIR",
    "DTYPE",
    "SPECULATIVE_METHOD",
    "NUM_SPECULATIVE_TOKENS",
    "TENSOR_PARALLEL_SIZE",
    "MAX_NUM_SEQS",
    "MAX_NUM_BATCHED_TOKENS",
    "MAX_MODEL_LEN",
    "BLOCK_SIZE",
    "ENFORCE_EAGER",
    "ENABLE_PREFIX_CACHING",
    "KV_CACHE_DTYPE",
    "MOE_BACKEND",
    "ATTENTION_BACKEND",
    "TARGET_ATTENTION",
)
# Of those, the ones holding a path (recorded through portable()).
RECIPE_PATH_KEYS = ("MODEL_DIR", "DRAFT_MODEL_DIR")


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        **cpu_kind(),
    }


def redacted_argv(argv: Sequence[str]) -> str:
    """The command line with the API key's value hidden."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
        elif a == "--api-key":
            out.append(a)
            hide = True
        elif a.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(a)
    return shlex.join(out)


def recipe_info(path: str | None, overrides: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The recipe config that launched the server: path, sha256, deployment keys.

    `overrides` are the `--set KEY=VALUE` the server was launched with; they are
    applied to the values and recorded, since the file's hash alone misses them.

    Raises the loader's ConfigError (one line naming the key) or FileNotFoundError.
    """
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe config not found: {p}")
    cfg = load_config(p, overrides or None)
    values = {k: cfg.value(k) for k in RECIPE_KEYS}
    return {
        "path": portable(p.resolve()),
        "sha256": cfg.digest(),
        "overrides": {k: portable(v) for k, v in (overrides or {}).items()},
        "files": [portable(f) for f in cfg.files],
        "values": {
            k: (portable(v) if isinstance(v, Path) or (k in RECIPE_PATH_KEYS and isinstance(v, str)) else v)
            for k, v in values.items()
        },
        "speculative": bool(cfg.speculative),
    }


def local_provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return {
        "tool": "kimidflash.bench",
        "tool_version": __version__,
        "git": git_info(REPO_ROOT),
        "host": host_info(),
        "command": portable_argv(redacted_argv(list(argv if argv is not None else sys.argv))),
        "utc_time": utc_now(),
    }
