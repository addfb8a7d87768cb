"""Shared fixtures. Tiers: plain tests are the fast tier (seconds); tests marked
`slow` run real vLLM on CPU, real vLLM wheels or a real Docker engine."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from kimidflash.background import metrics, serving_process

from .helpers import CONFIGS


class RunningServer:
    def __init__(self, proc: subprocess.Popen, base_url: str, log: Path):
        self.proc, self.base_url, self.log = proc, base_url, log

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over labels except `position`."""
        return metrics(self.base_url)


@contextlib.contextmanager
def serving(config: str | Path, *overrides: str, timeout: float = 1200, cmd: list[str] | None = None,
            port: int | None = None) -> Iterator[RunningServer]:
    """Run `serve` on a free port until the block ends; then SIGTERM it like a user would."""
    log = Path(os.environ.get("PYTEST_SERVER_LOG_DIR", "/tmp")) / f"kimidflash-serve-{os.getpid()}-{time.monotonic_ns()}.log"
    with serving_process(config, list(overrides), log, timeout, cmd, port) as (proc, base):
        yield RunningServer(proc, base, log)


@pytest.fixture(scope="session")
def cpu_tiny_config() -> Path:
    return CONFIGS / "cpu-tiny.env"
