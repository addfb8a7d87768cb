"""Small helpers shared by tests."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PRODUCTION_CONFIGS = sorted(p.name for p in CONFIGS.glob("production*.env"))
ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.env"))
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_env(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
