"""Shared fixtures. Tiers: plain tests are the fast tier (seconds); tests marked
`slow` run real vLLM on CPU, real vLLM wheels or a real Docker engine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from kimidflash.train.server import metrics

from .helpers import CONFIGS, ROOT, free_port


class RunningServer:
    def __init__(self, proc: subprocess.Popen, base_url: str, log: Path):
        self.proc, self.base_url, self.log = proc, base_url, log

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over labels except `position`."""
        return metrics(self.base_url)


@contextlib.contextmanager
def serving(config: str | Path, *overrides: str, timeout: float = 1200, cmd: list[str] | None = None) -> Iterator[RunningServer]:
    """Run `serve` on a free port until the block ends; then SIGTERM it like a user would."""
    port = free_port()
    log = Path(os.environ.get("PYTEST_SERVER_LOG_DIR", "/tmp")) / f"kimidflash-serve-{port}.log"
    sets = [a for kv in (f"PORT={port}", *overrides) for a in ("--set", kv)]
    argv = (cmd or [sys.executable, "-m", "kimidflash", "serve"]) + [str(config), *sets, "--quiet", "--log-file", str(log)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited {proc.returncode}:\n{proc.stdout.read()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"server not healthy after {timeout}s; log: {log}")
            time.sleep(1)
        yield RunningServer(proc, base, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="session")
def cpu_tiny_config() -> Path:
    return CONFIGS / "cpu-tiny.env"
