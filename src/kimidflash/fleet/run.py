"""Bring a fleet up and down: local replicas through the recipe's serve path,
remote ones checked, vllm-router in front, everything stopped on the way out.

Each local replica is `python -m kimidflash serve CONFIG` (validation,
preflight, launcher, health wait) in its own process group; the router is its
own group too. The context manager's exit stops the router first (no new
traffic), then the replicas, each with SIGTERM and, if it hangs, SIGKILL to
its group: nothing outlives `fleet`, whether it ends by Ctrl-C, SIGTERM or an
error.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from ..background import ServeError, serving_process
from ..errors import FleetError
from ..logtail import Log
from ..procgroup import stop_group
from .router import router_argv, router_url
from .spec import Fleet
from .venv import ensure_router


def check_remotes(fleet: Fleet, timeout: float = 10.0) -> None:
    """Each remote replica answers /v1/models with the fleet's served name."""
    want = {r.served.served_model_name for r in fleet.local}
    for r in fleet.replicas:
        if r.local:
            continue
        try:
            resp = httpx.get(f"{r.base_url}/v1/models", timeout=timeout)
            resp.raise_for_status()
            names = {m.get("id") for m in resp.json().get("data", [])}
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise FleetError(
                f"{fleet.path}: replica {r.name!r} at {r.base_url} does not answer /v1/models: {exc}"
            ) from None
        if want and not (want & names):
            raise FleetError(
                f"{fleet.path}: replica {r.name!r} serves {sorted(names)}, the local replicas "
                f"{sorted(want)}; every replica must serve the same model name"
            )
        want = want or names


@contextlib.contextmanager
def router_process(fleet: Fleet, exe: Path, log_path: Path) -> Iterator[subprocess.Popen]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            router_argv(fleet, str(exe)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc, grace=15)


def wait_healthy(fleet: Fleet, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """Until the router's /health says every replica is healthy (it answers 503
    naming the unhealthy ones until then)."""
    url, last = f"{router_url(fleet)}/health", "no answer yet"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
            raise ServeError(f"vllm-router exited {proc.returncode}; log {log_path}:\n{tail}")
        try:
            r = httpx.get(url, timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise ServeError(f"vllm-router not healthy after {timeout:.0f}s ({last}); log {log_path}")


@contextlib.contextmanager
def running_fleet(
    fleet: Fleet, log_dir: Path, say: Log = print, timeout: float = 900
) -> Iterator[dict[str, subprocess.Popen]]:
    """Yield {name: process} (each local replica's serve, and "router") once the
    router reports every replica healthy; stop them all at exit."""
    check_remotes(fleet)
    exe = ensure_router(fleet.router.version, log=say)
    procs: dict[str, subprocess.Popen] = {}
    with contextlib.ExitStack() as stack:
        for r in fleet.local:
            port = r.served.port
            assert r.config_path is not None, f"local replica {r.name} has no config file"
            say(f"fleet: starting replica {r.name} ({r.config_path}) on port {port}")
            proc, _ = stack.enter_context(
                serving_process(r.config_path, list(r.overrides), log_dir / f"{r.name}.log", timeout=timeout, port=port)
            )
            procs[r.name] = proc
        say(f"fleet: starting vllm-router {fleet.router.version} ({fleet.router.policy}) on {router_url(fleet)}")
        log = log_dir / "router.log"
        procs["router"] = stack.enter_context(router_process(fleet, exe, log))
        wait_healthy(fleet, procs["router"], log, timeout=120)
        yield procs
