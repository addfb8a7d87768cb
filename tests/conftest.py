"""Shared fixtures. Tiers: plain tests are the fast tier (seconds); tests marked
`slow` run real vLLM on CPU, real vLLM wheels or a real Docker engine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kimidflash.background import ServeError, serving_process
from kimidflash.bench import ab
from kimidflash.bench.metrics import scrape
from kimidflash.config import load_config
from kimidflash.render import render
from kimidflash.sweep import execute

from .support.fakeserver import FakeServer, Plan
from .support.helpers import CONFIGS, DFLASH, write_env


class RunningServer:
    def __init__(self, proc: subprocess.Popen, base_url: str, log: Path):
        self.proc, self.base_url, self.log = proc, base_url, log

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over labels except `position`."""
        return scrape(self.base_url)


@contextlib.contextmanager
def serving(
    config: str | Path, *overrides: str, timeout: float = 1200, cmd: list[str] | None = None, port: int | None = None
) -> Iterator[RunningServer]:
    """Run `serve` on a free port until the block ends; then SIGTERM it like a user would."""
    log = (
        Path(os.environ.get("PYTEST_SERVER_LOG_DIR", "/tmp"))
        / f"kimidflash-serve-{os.getpid()}-{time.monotonic_ns()}.log"
    )
    with serving_process(config, list(overrides), log, timeout, cmd, port) as (proc, base):
        yield RunningServer(proc, base, log)


class SharedServers:
    """The servers one pytest process keeps for every test module that asks for the same served
    config, so CI starts each once. Two asks are the same when their rendered `vllm serve` command
    and environment (the port aside) and their launcher (`cmd`) are; at most `keep` servers run, the
    least recently asked stopped first, and one that died is started again."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.running: dict[tuple, tuple[contextlib.ExitStack, RunningServer]] = {}
        self.started = 0

    @staticmethod
    def key(config: str | Path, overrides: tuple[str, ...], cmd: list[str] | None) -> tuple:
        rendered = render(load_config(config, dict(kv.split("=", 1) for kv in overrides)))
        argv = list(rendered.argv)
        if "--port" in argv:
            del argv[argv.index("--port") : argv.index("--port") + 2]
        return tuple(argv), tuple(sorted(rendered.env.items())), tuple(cmd or ())

    def get(self, config: str | Path, *overrides: str, cmd: list[str] | None = None) -> RunningServer:
        key = self.key(config, overrides, cmd)
        if key in self.running:
            stack, server = self.running.pop(key)
            if server.proc.poll() is None:
                self.running[key] = (stack, server)  # now the most recently asked
                return server
            stack.close()
        while len(self.running) >= self.keep:
            self.running.pop(next(iter(self.running)))[0].close()
        stack = contextlib.ExitStack()
        server = stack.enter_context(serving(config, *overrides, cmd=cmd))
        self.running[key] = (stack, server)
        self.started += 1
        return server

    def close(self) -> None:
        while self.running:
            self.running.popitem()[1][0].close()


@pytest.fixture(scope="session")
def shared_server() -> Iterator[SharedServers]:
    servers = SharedServers()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="session")
def cpu_tiny_config() -> Path:
    return CONFIGS / "cpu-tiny.env"


# Fixtures two test modules share: `kimidflash ab` against the fake server (test_train_ab.py,
# test_bench_categories.py) and the sweep against scripted servers (test_sweep.py,
# test_sweep_schedule.py).


@pytest.fixture
def fake_serving(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Replace the real server with the fake one; record each launch's overrides."""
    launches: list[list[str]] = []

    @contextlib.contextmanager
    def serving_process(
        config: Path, overrides: list[str], log: Path, timeout: float = 900
    ) -> Iterator[tuple[Any, str]]:
        launches.append(overrides)
        spec = 0 if "SPECULATIVE_METHOD=none" in overrides else 3
        with FakeServer(
            Plan(chunks=(1, 2, 3)) if spec else Plan(chunks=(1,) * 6), model="tiny-qwen3-dflash", spec_tokens=spec
        ) as s:  # the fake serves from this process: its pid is the server's
            yield SimpleNamespace(pid=os.getpid()), s.base_url.removesuffix("/v1")

    monkeypatch.setattr(ab, "serving_process", serving_process)
    monkeypatch.setattr(ab, "prepare", lambda config, log: None)  # no venv or models for the fake server
    return launches


@pytest.fixture
def drafter(tmp_path: Path) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(DFLASH))
    return d


ACCEPTED = 2  # every draft step accepts min(k, 2) tokens: positions 0 and 1 always, never later


class Fleet:
    """The serve path's stand-in: one FakeServer per point, with faults on request."""

    def __init__(self, base: Path):
        self.model = load_config(base).served_model_name
        self.served: list[str] = []
        self.refuse: set[str] = set()  # `--set` strings whose server never becomes ready
        self.die: set[str] = set()  # ... whose server dies at its first request
        self.interrupt: set[str] = set()  # ... where the user presses Ctrl-C
        self.terminate: set[str] = set()  # ... where the sweep gets SIGTERM

    @contextlib.contextmanager
    def __call__(self, base: Path, sets: list[str], log: Path, timeout: float) -> Iterator[execute.Served]:
        key = " ".join(sets)
        self.served.append(key)
        with open(log, "a") as f:
            f.write(f"INFO starting fake server for {key}\n")
        if key in self.interrupt:
            raise KeyboardInterrupt
        if key in self.terminate:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        if key in self.refuse:
            with open(log, "a") as f:
                f.write("ERROR RuntimeError: out of KV cache blocks\n")
            raise ServeError(f"serve {base} exited 1; log {log}:\nserve: server exited with code 1")
        cfg = load_config(base, dict(s.split("=", 1) for s in sets))
        k = cfg.num_speculative_tokens if cfg.speculative else 0
        step = 1 + min(k, ACCEPTED)
        delay = 0.002 * (1 + 0.25 * k)  # a step costs more the more it verifies
        dying = key in self.die

        def plan(idx: int, body: dict) -> Plan:
            if dying:
                server.die()
            return Plan(chunks=(1,) + (step,) * 6, delay=delay)

        server = FakeServer(plan, model=self.model, spec_tokens=k).start()
        try:
            yield execute.Served(server.base_url.removesuffix("/v1"), lambda: not dying)
        finally:
            server.stop()


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_env(tmp_path / "base.env", f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\n")


@pytest.fixture
def fleet(base: Path, monkeypatch) -> Fleet:
    f = Fleet(base)
    monkeypatch.setattr(execute, "serve_with_recipe", f)
    return f


# The modules CI runs in a second pytest process beside the rest (.ci/run): image and fresh-clone
# builds, trees read with vLLM's own code, and tests whose servers are tiny. They mostly wait on
# pip, debootstrap, Docker and Python imports (one core, or none), which the model-serving and
# training tests of the first process leave free; run one after the other the suite outgrew CI's
# hour on two cores. Everything they share with the first process under the cache (venvs, tiny
# models, downloads, extracted wheels) is made under a lock, so whichever asks first makes it.
BESIDE = frozenset(
    {
        "test_docker_slow",
        "test_readme",
        "test_backend_selection",
        "test_patcher_wheels",
        "test_fp8_p10_patched",
        "test_draft_attention_kernel",
        "test_cpu_serve",
        "test_cpu_kimi_slow",
        "test_fleet_slow",
        "test_eagle3_slow",
        "test_real_prompt_sources",
        "test_speculators_export",
        "test_train_ddp",
        "test_train_rope",
        "test_profile",
        "test_capture_vllm_slow",
    }
)
# The tiny K2.6's servers moved here after the run of 6ac974c: the rest's process took 77 of its
# 82 minutes, this one 52. The profiler and the vLLM capture (SmolLM2 servers, 230 s together) after
# the run of 80f93b9, when this process began beside the fast tier: the rest took 58 of 66 minutes.
# Not beside: torch generating or training on both cores (the Hugging Face regen took 800 s there,
# 34 s alone: two processes' spinning OpenMP threads on two cores slow each other far more than 2x).


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in BESIDE:
            item.add_marker(pytest.mark.beside)
