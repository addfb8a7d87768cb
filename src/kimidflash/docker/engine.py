"""Find a reachable Docker engine, or (for tests and CI) make one.

Two callers want different things. A user running `kimidflash build` or
`serve.sh` with RUNTIME=docker on a production host must never have a
daemon installed behind their back: they get one line saying how to start
one, and exit 2 (`require_client`). Tests and CI on a bare machine need a
real engine and may install Debian's docker.io and start a private dockerd
with its own socket, data root and pid file (`ensure_engine`), so it never
collides with a system daemon and its image cache survives between runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import BuildFailed, EngineUnavailable
from ..logtail import Log

PRIVATE_ROOT = Path(os.environ.get("KIMIDFLASH_DOCKER_ROOT", "/run/kimidflash-docker"))
PRIVATE_SOCKET = PRIVATE_ROOT / "docker.sock"
PRIVATE_DATA = Path(os.environ.get("KIMIDFLASH_DOCKER_DATA", "/var/lib/kimidflash-docker"))
SYSTEM_SOCKET = Path("/var/run/docker.sock")
START_HINT = (
    "start one (`sudo systemctl start docker`), or point DOCKER_HOST at a running daemon; "
    "test machines: `python -m kimidflash docker-engine --ensure` installs docker.io and starts a private dockerd"
)


# A docker.DockerClient: the SDK is an optional dependency, imported where a client is made.
Client = Any


@dataclass(frozen=True)
class Engine:
    base_url: str
    server_version: str
    api_version: str


def candidate_urls() -> list[str]:
    """DOCKER_HOST if set (and only it: the user chose), else the system socket, then ours."""
    if os.environ.get("DOCKER_HOST"):
        return [os.environ["DOCKER_HOST"]]
    return [f"unix://{SYSTEM_SOCKET}", f"unix://{PRIVATE_SOCKET}"]


def _connect(url: str, timeout: int = 600) -> Client | None:
    import docker  # the SDK is an optional dependency: import where needed

    if url.startswith("unix://") and not Path(url[len("unix://") :]).exists():
        return None
    try:
        client = docker.DockerClient(base_url=url, version="auto", timeout=timeout)
        client.ping()
        client.kimidflash_url = url  # the SDK rewrites unix URLs; the docker CLI needs the original
        return client
    except Exception:  # any failure to talk to it means "not this one"
        return None


def find_client(timeout: int = 600) -> Client | None:
    """The first daemon that answers a ping, or None."""
    for url in candidate_urls():
        client = _connect(url, timeout)
        if client is not None:
            return client
    return None


def engine_url(client: Client) -> str:
    """The daemon address as DOCKER_HOST spells it, for the docker CLI."""
    return getattr(client, "kimidflash_url", "") or os.environ.get("DOCKER_HOST", "") or f"unix://{SYSTEM_SOCKET}"


def describe(client: Client) -> Engine:
    v = client.version()
    return Engine(engine_url(client), v.get("Version", "?"), v.get("ApiVersion", "?"))


def require_free_space(client: Client, gib: float, what: str) -> None:
    """Refuse up front when the engine's data root is on this machine and too full
    for `what` (a build that runs out of space fails minutes in, deep in pip's output)."""
    root = (client.info() or {}).get("DockerRootDir")
    if not root or not Path(root).is_dir():
        return  # a remote engine: its disk is not ours to measure
    free = shutil.disk_usage(root).free / 2**30
    if free < gib:
        raise EngineUnavailable(
            f"{what} needs about {gib:g} GiB free in the Docker data root {root}, which has "
            f"{free:.1f} GiB: free space (docker image prune, or the disk it is on) and retry"
        )


def require_client(timeout: int = 600) -> Client:
    """For user-facing commands: a client, or EngineUnavailable with the how-to line."""
    try:
        import docker  # noqa: F401
    except ImportError:
        raise EngineUnavailable("the docker SDK is not installed: pip install 'kimidflash[docker]'") from None
    client = find_client(timeout)
    if client is None:
        tried = ", ".join(candidate_urls())
        raise EngineUnavailable(f"no Docker engine reachable at {tried}: {START_HINT}")
    return client


def _install_docker_io(log: Log) -> None:
    if shutil.which("dockerd"):
        return
    if not shutil.which("apt-get"):
        raise EngineUnavailable("no dockerd on this machine and no apt-get to install docker.io")
    log("installing Debian's docker.io (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "docker.io"], check=True, env=env, stdout=subprocess.DEVNULL)


def start_private_dockerd(log: Log, wait_s: float = 60.0) -> Client:
    """Start dockerd on our own socket (overlay2, no iptables, no bridge) and wait for it."""
    import docker  # noqa: F401  (no daemon installed for a client that could not talk to it)

    _install_docker_io(log)
    PRIVATE_ROOT.mkdir(parents=True, exist_ok=True)
    PRIVATE_DATA.mkdir(parents=True, exist_ok=True)
    pidfile = PRIVATE_ROOT / "dockerd.pid"
    logfile = PRIVATE_ROOT / "dockerd.log"
    # A stale pid file from a dead daemon makes dockerd refuse to start.
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text().strip()), 0)
        except (ValueError, ProcessLookupError):
            pidfile.unlink()
    cmd = [
        "dockerd",
        "--storage-driver=overlay2",
        "--iptables=false",
        "--bridge=none",
        "-H",
        f"unix://{PRIVATE_SOCKET}",
        "--data-root",
        str(PRIVATE_DATA),
        "--exec-root",
        str(PRIVATE_ROOT / "exec"),
        "-p",
        str(pidfile),
    ]
    log(f"starting a private dockerd on {PRIVATE_SOCKET} (log: {logfile})")
    with open(logfile, "ab") as out:
        subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        client = _connect(f"unix://{PRIVATE_SOCKET}")
        if client is not None:
            return client
        time.sleep(0.5)
    tail = logfile.read_text(errors="replace").splitlines()[-5:]
    raise EngineUnavailable(f"dockerd did not answer within {wait_s:.0f}s; last log lines: {' | '.join(tail)}")


def ensure_engine(log: Log = lambda m: print(f"kimidflash: {m}", file=sys.stderr)) -> Client:
    """For tests and CI: a reachable daemon, installing and starting one if needed."""
    client = find_client()
    if client is not None:
        return client
    if os.environ.get("DOCKER_HOST"):
        raise EngineUnavailable(f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer")
    if os.geteuid() != 0:
        raise EngineUnavailable(f"no Docker engine reachable and not root, so none can be started: {START_HINT}")
    return start_private_dockerd(log)


def stream_build(client: Client, log: Log, **kwargs: Any) -> str:
    """Run api.build, showing each step and its output live; return the image id.

    Beside the engine helpers because both image builds use it (the recipe image
    in build.py, the CPU base in cpu_base.py)."""
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
                    console.print(line, style="bold", markup=False, soft_wrap=True)
                elif line.strip():
                    console.print(f"  {line}", style="dim", markup=False, soft_wrap=True)
    if not image_id:
        m = re.search(r"Successfully built ([0-9a-f]+)", "\n".join(tail))
        if not m:
            raise BuildFailed("the builder finished without reporting an image id")
        image_id = m.group(1)
    log(f"built {image_id[:19]} in {time.monotonic() - started:.0f}s")
    return image_id
