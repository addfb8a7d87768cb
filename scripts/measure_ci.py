"""Time `.ci/run` on a fresh clone of HEAD, as CI runs it, and write a result file.

    python3 scripts/measure_ci.py empty OUT.json       # every cache empty, pip's and the downloads' too
    python3 scripts/measure_ci.py downloads-kept OUT.json [--downloads DIR --pip-cache DIR]

`.ci/run` always starts with an empty project cache, venv and Docker engine;
`empty` also gives it an empty pip cache and an empty KIMIDFLASH_DOWNLOADS
folder (a new machine), `downloads-kept` the folders named (those of an earlier
run: what a CI machine keeps). The JSON records the wall time, pytest's
closing line, the slowest tests, and the provenance (commit, machine, date,
whether docker.io and debootstrap were already installed, which a new
machine does not have).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from kimidflash.hostinfo import cpu_kind  # noqa: E402 - standard library only, imported by path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("empty", "downloads-kept"))
    p.add_argument("out", type=Path)
    p.add_argument("--downloads", type=Path, help="KIMIDFLASH_DOWNLOADS to keep (downloads-kept)")
    p.add_argument("--pip-cache", type=Path, help="PIP_CACHE_DIR to keep (downloads-kept)")
    p.add_argument("--log", type=Path, help="where .ci/run's output goes (default: beside OUT)")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kimidflash-measure-"))
    if a.mode == "empty":
        downloads, pip_cache = work / "downloads", work / "pip-cache"
    else:
        if not (a.downloads and a.pip_cache):
            p.error("downloads-kept needs --downloads and --pip-cache (the folders of an earlier run)")
        downloads, pip_cache = a.downloads, a.pip_cache
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMIDFLASH_")}
    env.update(CI="true", KIMIDFLASH_DOWNLOADS=str(downloads), PIP_CACHE_DIR=str(pip_cache))
    preinstalled = {tool: shutil.which(tool) is not None for tool in ("dockerd", "debootstrap")}
    log = a.log or a.out.with_suffix(".log")
    t0 = time.monotonic()
    with open(log, "w") as sink:
        rc = subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        ).returncode
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    # .ci/run runs pytest three times (the fast tier, then the slow tier's two processes, the second's
    # lines prefixed [beside]): every closing line, and every run's slowest tests.
    lines = [(line.startswith("[beside] "), line.removeprefix("[beside] ")) for line in text.splitlines()]
    closing = [
        ("beside: " if beside else "") + line.strip("= ")
        for beside, line in lines
        if line.startswith("=") and re.search(r"\d+ (passed|failed)", line) and " in " in line
    ]
    slowest = re.findall(r"^(?:\[beside\] )?(\d+\.\d+)s (call|setup|teardown)\s+(\S+)", text, flags=re.M)
    result = {
        "what": ".ci/run wall time on a fresh clone",
        "mode": a.mode,
        "exit_code": rc,
        "wall_s": round(wall, 1),
        "pytest": closing,
        "slowest": sorted(
            ({"seconds": float(s), "phase": ph, "test": t} for s, ph, t in slowest), key=lambda r: -r["seconds"]
        ),
        "provenance": {
            "commit": commit,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
            "cpu": cpu_kind(),  # kimidflash.hostinfo: model name and vector extensions
            "python": platform.python_version(),
            "already_installed": preinstalled,
        },
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, a.out)
    shutil.rmtree(clone, ignore_errors=True)
    print(f"{a.mode}: exit {rc}, {wall:.0f} s, {'; '.join(closing)}; kept downloads {downloads}, pip cache {pip_cache}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
