"""Where the recipe's files and caches live."""

from __future__ import annotations

import os
from pathlib import Path

# The checkout this package runs from (src layout: <root>/src/kimidflash).
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
LAUNCHER = REPO_ROOT / "launchers" / "kimi26-vllm-dflash.sh"


def cache_dir() -> Path:
    """Venvs, generated models and downloaded wheels; shared by clones on one machine."""
    root = os.environ.get("KIMIDFLASH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kimidflash")
    return Path(root)
