"""`kimidflash build`: build Dockerfile.kimi26-dflash through the docker SDK.

Why a Python command and not `docker build` in a script: the tag must carry
the patch-set hash, which is known only once the patcher has run inside the
image; the base image and vLLM pin come from the same env config serve.sh
reads; and on CI the CPU base has to be made first. The SDK drives the
classic builder, which rejects `RUN --mount`; the Dockerfile's only mount is
the optional CA secret, so without --ca-bundle the classic builder gets the
same Dockerfile with that optional mount removed (same result: the secret is
absent either way). With --ca-bundle the build goes to BuildKit through the
docker CLI, since the SDK cannot pass secrets.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ..paths import REPO_ROOT

DOCKERFILE = "Dockerfile.kimi26-dflash"
DEFAULT_NAME = "kimidflash/kimi26-dflash"
REPORT_PATH = "/opt/kimidflash/patch-report.json"
LABEL_VLLM = "io.kimidflash.vllm-version"
LABEL_PATCHSET = "io.kimidflash.patchset-hash"
# What the image needs from the checkout; everything else (.git, .venv, caches) stays out.
CONTEXT_DIRS = ("src", "patches", "payload", "launchers", "configs")
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
SECRET_MOUNT = re.compile(r"--mount=type=secret,[^\s\\]*\s*")

Log = Callable[[str], None]


class BuildFailed(RuntimeError):
    """The build stopped; the message is the builder's (or patcher's) own last error lines."""


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    report: dict[str, Any]


def _log(message: str) -> None:
    print(f"kimidflash: {message}", file=sys.stderr)


def classic_dockerfile(text: str) -> str:
    """The Dockerfile for the classic builder: the optional secret mounts dropped."""
    return SECRET_MOUNT.sub("", text)


def build_context(root: Path = REPO_ROOT, dockerfile_text: str | None = None,
                  extra: dict[str, bytes] | None = None) -> io.BytesIO:
    """A tar of just what the Dockerfile copies, with deterministic metadata."""
    buf = io.BytesIO()

    def norm(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if SKIP_PARTS.intersection(Path(info.name).parts) or info.name.endswith(".pyc"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0  # so unchanged files keep the builder's layer cache
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in CONTEXT_DIRS:
            if (root / d).exists():
                tar.add(str(root / d), arcname=d, filter=norm)
            else:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
        text = dockerfile_text if dockerfile_text is not None else (root / DOCKERFILE).read_text()
        for name, data in {DOCKERFILE: text.encode(), **(extra or {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def stream_build(client, log: Log, **kwargs: Any) -> str:
    """Run api.build, showing each step and its output live; return the image id."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    tail: list[str] = []
    image_id = ""
    started = time.monotonic()
    with console.status("build: starting") as status:
        for chunk in client.api.build(decode=True, **kwargs):
            if "error" in chunk:
                msg = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                lines = [line for line in tail if line.strip()][-15:]
                raise BuildFailed("\n".join([*lines, msg.strip()]))
            if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
            text = chunk.get("stream") or chunk.get("status") or ""
            for line in text.rstrip("\n").splitlines():
                tail = [*tail[-40:], line]
                if line.startswith("Step "):
                    status.update(f"build {time.monotonic() - started:5.0f}s  {line[:100]}")
                    console.print(line, style="bold", markup=False)
                elif line.strip():
                    console.print(f"  {line}", style="dim", markup=False)
    if not image_id:
        m = re.search(r"Successfully built ([0-9a-f]+)", "\n".join(tail))
        if not m:
            raise BuildFailed("the builder finished without reporting an image id")
        image_id = m.group(1)
    log(f"built {image_id[:19]} in {time.monotonic() - started:.0f}s")
    return image_id
