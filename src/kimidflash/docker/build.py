"""`kimidflash build`: build Dockerfile.kimi26-dflash through the docker SDK.

Why a Python command and not `docker build` in a script: the tag and label
carry the patch-set hash (asked of the patcher, then checked against the
report it writes inside the image); the base image and vLLM pin come from
the same env config serve.sh reads; and on CI the CPU base has to be made
first. The SDK drives the
classic builder, which rejects `RUN --mount`; the Dockerfile's only mount is
the optional CA secret, so without --ca-bundle the classic builder gets the
same Dockerfile with that optional mount removed (same result: the secret is
absent either way). With --ca-bundle the build goes to BuildKit through the
docker CLI, since the SDK cannot pass secrets.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..backends import patchset_hash
from ..errors import BuildFailed
from ..logtail import Log
from ..paths import REPO_ROOT
from ..settings import BY_NAME
from .engine import Client, engine_url, stream_build

DOCKERFILE = "Dockerfile.kimi26-dflash"
DEFAULT_NAME = BY_NAME["IMAGE_NAME"].default
REPORT_PATH = "/opt/kimidflash/patch-report.json"
LABEL_VLLM = "io.kimidflash.vllm-version"
LABEL_PATCHSET = "io.kimidflash.patchset-hash"
# What the image needs from the checkout; everything else (.git, .venv, caches) stays out.
CONTEXT_DIRS = ("src", "patches", "payload", "launchers", "configs")
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
SECRET_MOUNT = re.compile(r"--mount=type=secret,[^\s\\]*\s*")


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


def build_context(
    root: Path = REPO_ROOT, dockerfile_text: str | None = None, extra: dict[str, bytes] | None = None
) -> io.BytesIO:
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


def read_report(client: Client, image: str, path: str = REPORT_PATH) -> dict[str, Any]:
    """The patch report from the image's filesystem, without starting a container."""
    container = client.containers.create(image, entrypoint=["true"], command=[])
    try:
        bits, _ = container.get_archive(path)
        raw = io.BytesIO(b"".join(bits))
        with tarfile.open(fileobj=raw) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            if f is None:
                raise BuildFailed(f"{path} in {image} is not a file")
            return json.loads(f.read())
    finally:
        container.remove(force=True)


def image_tags(name: str, vllm_version: str, pset_hash: str) -> tuple[str, str]:
    return f"{name}:{vllm_version}-{pset_hash[:12]}", f"{name}:latest"


def _buildkit_cli() -> list[str] | None:
    """A docker CLI that can run BuildKit with secrets: buildx, or a pre-23 client with DOCKER_BUILDKIT=1."""
    seen: set[str] = set()
    for cand in (shutil.which("docker"), "/usr/bin/docker"):
        if not cand or cand in seen or not os.path.exists(cand):
            continue
        seen.add(cand)
        if subprocess.run([cand, "buildx", "version"], capture_output=True).returncode == 0:
            return [cand, "buildx", "build", "--load"]
        out = subprocess.run(
            [cand, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True
        ).stdout
        if out.strip().split(".")[0].isdigit() and int(out.strip().split(".")[0]) < 23:
            return [cand, "build"]
    return None


def _cli_build(
    client: Client,
    log: Log,
    context: io.BytesIO,
    buildargs: dict[str, str],
    ca_bundle: Path,
    nocache: bool,
    tag: str | None,
) -> str:
    """BuildKit through the docker CLI, the only way to pass the CA bundle as a secret."""
    cli = _buildkit_cli()
    if cli is None:
        raise BuildFailed("--ca-bundle needs BuildKit: install docker buildx (or build without --ca-bundle)")
    with tempfile.TemporaryDirectory() as tmp:
        iid = Path(tmp) / "iid"
        cmd = [
            *cli,
            "--progress=plain",
            "--network",
            "host",
            "-f",
            DOCKERFILE,
            "--iidfile",
            str(iid),
            "--secret",
            f"id=ca,src={ca_bundle}",
        ]
        for k, v in buildargs.items():
            cmd += ["--build-arg", f"{k}={v}"]
        if nocache:
            cmd.append("--no-cache")
        if tag:
            cmd += ["-t", tag]
        cmd.append("-")
        env = {**os.environ, "DOCKER_BUILDKIT": "1", "DOCKER_HOST": engine_url(client)}
        log(f"BuildKit via {' '.join(cli)} (CA bundle as secret 'ca')")
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert proc.stdin and proc.stdout
        proc.stdin.write(context.getvalue())
        proc.stdin.close()
        tail: list[str] = []
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail = [*tail[-40:], line]
            print(f"  {line}", file=sys.stderr)
        if proc.wait() != 0:
            raise BuildFailed("\n".join(tail[-15:]))
        return iid.read_text().strip()


def host_patchset_hash(root: Path, patch_set: Path | None) -> str:
    """The short patch-set hash of the checkout at `root` (backends.patchset_hash); a failure stops the build."""
    try:
        return patchset_hash(root / "patches" / "patch_dflash_rocm.py", patch_set)
    except ValueError as exc:
        raise BuildFailed(str(exc)) from None


def build_image(
    client: Client,
    *,
    base_image: str,
    vllm_version: str,
    name: str = DEFAULT_NAME,
    log: Log = _log,
    ca_bundle: Path | None = None,
    patch_set: Path | None = None,
    nocache: bool = False,
    root: Path = REPO_ROOT,
) -> BuildResult:
    """One build: the host knows the patch-set hash up front (label and tag); the
    image checks its own patch report against it, so the two cannot disagree."""
    text = (root / DOCKERFILE).read_text()
    pset = host_patchset_hash(root, patch_set)
    extra: dict[str, bytes] = {}
    buildargs = {"BASE_IMAGE": base_image, "VLLM_VERSION": vllm_version, "PATCHSET_HASH": pset}
    if patch_set is not None:
        # Travels inside patches/ in the context only; the checkout is untouched.
        extra[f"patches/{patch_set.name}"] = patch_set.read_bytes()
        buildargs["PATCH_SET"] = f"/opt/kimidflash/patches/{patch_set.name}"
    versioned, latest = image_tags(name, vllm_version, pset)
    log(f"building {versioned} from {base_image}")
    if ca_bundle is not None:
        image_id = _cli_build(client, log, build_context(root, text, extra), buildargs, ca_bundle, nocache, versioned)
    else:
        image_id = stream_build(
            client,
            log,
            fileobj=build_context(root, classic_dockerfile(text), extra),
            custom_context=True,
            dockerfile=DOCKERFILE,
            buildargs=buildargs,
            tag=versioned,
            network_mode="host",
            rm=True,
            forcerm=True,
            nocache=nocache,
        )
    client.images.get(image_id).tag(latest.rsplit(":", 1)[0], "latest")
    return BuildResult(image_id, (versioned, latest), read_report(client, image_id))


def print_report(result: BuildResult) -> None:
    """The patch report, as the patcher wrote it, under the tags it produced."""
    console = Console(highlight=False)
    console.print(f"[bold]image[/bold] {result.image_id[:19]}  tags: {', '.join(result.tags)}")
    console.print(f"[bold]patch report[/bold] ({REPORT_PATH}):")
    console.print_json(json.dumps(result.report))
