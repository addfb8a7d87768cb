"""The recipe's server in the background, for what needs a live target.

Drafter regen, the acceptance checks, the drafter A/B and the slow tests talk
to the target exactly as users do: the recipe's `python -m kimidflash serve
CONFIG` (validation, preflight, launcher, health wait), on a free loopback
port, stopped with SIGTERM at the end.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import ServeError
from .paths import REPO_ROOT
from .procgroup import stop_group

# What `serve` prints once its own health wait has passed (serve.py, `say`).
READY_LINE = "serve: ready in "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving_process(
    config: str | Path,
    overrides: list[str],
    log_path: Path,
    timeout: float = 900,
    cmd: list[str] | None = None,
    port: int | None = None,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """Yield (serve process, base URL without /v1) once serve itself says it is ready;
    SIGTERM it at the end like a user.

    Ready is serve's own "serve: ready in ..." line, not a /health answer seen
    here first: a signal landing between the two is, to serve, an interrupted
    start (exit 143). `cmd` replaces `python -m kimidflash serve` (e.g. ./serve.sh);
    `port` defaults to a free one."""
    port = port or free_port()
    sets = [a for kv in (f"PORT={port}", *overrides) for a in ("--set", kv)]
    # serve runs from the repository root; a relative config or log is the caller's
    config, log_path = Path(config).absolute(), Path(log_path).absolute()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = (cmd or [sys.executable, "-m", "kimidflash", "serve"]) + [
        str(config),
        *sets,
        "--quiet",
        "--log-file",
        str(log_path),
    ]
    proc = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # also keeps the pipe from filling while the server runs
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(READY_LINE):
                ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while not ready.wait(1.0):
            if proc.poll() is not None:
                reader.join(5)  # the rest of its output
                raise ServeError(f"serve {config} exited {proc.returncode}; log {log_path}:\n{''.join(lines)[-2000:]}")
            if time.monotonic() > deadline:
                raise ServeError(f"serve {config}: not ready after {timeout:.0f}s; log {log_path}")
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc, grace=90, leader_only=True)  # serve stops its own launcher, as for a user


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM ends the caller the way Ctrl-C does, so the
    `finally` of `serving_process` stops the server it started (the server runs
    in its own session and would otherwise outlive a killed caller).

    Ctrl-C too raises KeyboardInterrupt at once, even inside `asyncio.run`: left
    to itself asyncio (3.11+) turns it into a cancellation of the main task, and
    the benchmark runner finishes a cancelled run as a result, so a sweep's
    Ctrl-C during a benchmark was lost and the sweep went on."""

    def raise_interrupt(signum, frame):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def served(config: str | Path, overrides: list[str], log_path: Path, timeout: float = 900) -> Iterator[str]:
    """Yield the server's base URL (no /v1) while `serve CONFIG --set ...` runs."""
    with serving_process(config, overrides, log_path, timeout) as (_, base):
        yield base
