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


# The modules CI runs in a second pytest process beside the rest (.ci/run): image and fresh-clone
# builds, trees read with vLLM's own code, and tests whose servers are tiny. They mostly wait on
# pip, debootstrap, Docker and Python imports (one core, or none), which the model-serving and
# training tests of the first process leave free; run one after the other the suite outgrew CI's
# hour on two cores. Everything they share with the first process under the cache (venvs, tiny
# models, downloads, extracted wheels) is made under a lock, so whichever asks first makes it.
BESIDE = frozenset({
    "test_docker_slow", "test_readme", "test_backend_selection", "test_patcher_wheels", "test_fp8_p10_patched",
    "test_draft_attention_kernel", "test_cpu_serve", "test_cpu_kimi_slow", "test_fleet_slow", "test_eagle3_slow",
    "test_real_prompt_sources", "test_speculators_export", "test_train_ddp", "test_train_rope",
})
# The tiny K2.6's servers moved here after the run of 6ac974c: the rest's process took 77 of its
# 82 minutes, this one 52.
# Not beside: torch generating or training on both cores (the Hugging Face regen took 800 s there,
# 34 s alone: two processes' spinning OpenMP threads on two cores slow each other far more than 2x).


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in BESIDE:
            item.add_marker(pytest.mark.beside)
