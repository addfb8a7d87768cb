"""Atomic file writes: a reader sees the old file or the whole new one, never half.

A leaf module (stdlib only) so every part of the package can use it without an
import cycle. Writes go to a temporary file in the destination's directory, are
fsynced, then renamed over the destination; on any failure the temporary file is
removed and the destination is untouched.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _umask_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")
