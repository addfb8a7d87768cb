"""`serve.sh`: validate, prepare, preflight, launch, wait for health, supervise.

The same function serves the MI300X configs and the CPU reference
deployment; only the config values differ. The server runs in its own
process group so that stopping it (Ctrl-C, SIGTERM, a failed start) takes
vLLM's engine-core children with it and leaves no orphan holding GPUs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx
from rich.console import Console
from rich.table import Table

from .config import FIELDS, Config, check_checkpoints
from .cpu_reference.generated import PREPARE_KIND
from .docker import run as docker_run
from .docker.engine import require_client
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED
from .logtail import STOP_GRACE_S, Log, LogTail
from .paths import LAUNCHER
from .preflight import PreflightError, preflight
from .prepare import launch_env, prepare
from .procgroup import stop_group
from .render import Rendered, attention_line, render

# start(log, echo) -> a server with `tail`, `poll()` and `stop()` (LocalServer or ContainerServer)
Starter = Callable[[TextIO | None, Log], Any]


class LocalServer:
    """The launcher as a child process group, its output pumped to a log."""

    def __init__(self, rendered: Rendered, env: dict[str, str], log: TextIO | None, echo: Log):
        self._sink = LogTail(log, echo)
        self.tail = self._sink.lines
        self.proc = subprocess.Popen(
            [str(LAUNCHER), "--", *rendered.argv],
            env={**env, **rendered.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._sink(line.rstrip("\n"))

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM the whole group, SIGKILL what is left after `grace` seconds."""
        status = stop_group(self.proc, grace)
        self._pump.join(timeout=5)
        return status


def curl_example(config: Config) -> str:
    auth = ' -H "Authorization: Bearer $API_KEY"' if config.api_key else ""
    body = json.dumps(
        {
            "model": config.served_model_name,
            "messages": [{"role": "user", "content": "Explain the Riemann hypothesis"}],
            "max_tokens": 128,
            "temperature": 0,
        }
    )
    return f"curl {config.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def wait_healthy(config: Config, server: Any, console: Console, stop: threading.Event) -> bool:
    deadline = time.monotonic() + config.health_timeout
    start = time.monotonic()
    url = f"{config.base_url}/health"
    with httpx.Client(timeout=2.0) as client, console.status("") as status:
        while time.monotonic() < deadline and not stop.is_set():
            if server.poll() is not None:
                return False
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            last = server.tail[-1][:100] if server.tail else ""
            status.update(f"waiting for {url} ({time.monotonic() - start:.0f}s / {config.health_timeout}s) {last}")
            stop.wait(1.0)
    return False


def print_plan(config: Config, rendered: Rendered, console: Console) -> None:
    console.print(
        f"# {config.path or 'defaults'} (runtime {config.runtime}, platform {config.platform})",
        markup=False,
        highlight=False,
    )
    console.print(f"# {attention_line(config)}", markup=False, highlight=False, soft_wrap=True)
    console.print(rendered.shell(), markup=False, highlight=False, soft_wrap=True)


def serve(
    config: Config,
    *,
    dry_run: bool = False,
    preflight_only: bool = False,
    prepare_only: bool = False,
    allow_numa_balancing: bool = False,
    log_path: Path | None = None,
    quiet: bool = False,
    proc_root: Path = Path("/proc"),
    dev_root: Path = Path("/dev"),
) -> int:
    """The phases in order: render (and stop there for a dry run), prepare what the
    runtime needs, check the checkpoints once they exist, preflight, start, supervise.
    `preflight_only` checks the host and the checkpoints as they are (an operator's
    first step, before the downloads), and prepares and starts nothing; `prepare_only` stops
    after the prepare phase, the checkpoints it made checked."""
    console = Console(stderr=True)
    say: Log = lambda msg: console.print(f"[bold]serve:[/bold] {msg}", highlight=False, soft_wrap=True)  # noqa: E731
    rendered = render(config)
    if preflight_only:
        check_checkpoints(config)
        return 0 if run_preflight(config, say, proc_root, dev_root, allow_numa_balancing) else 1
    if dry_run:
        check_checkpoints(config)  # nothing is prepared: the checkpoints are as they are
        if config.runtime == "docker":
            print(docker_run.dry_run_line(config, rendered))
        else:
            print_plan(config, rendered, Console())
        return 0
    start = prepare_runtime(config, rendered, say)
    check_checkpoints(config)  # the rules that read the models prepare may just have made
    if prepare_only:
        say(f"prepared {config.path or 'defaults'} ({config.runtime}); nothing started")
        return 0
    if not run_preflight(config, say, proc_root, dev_root, allow_numa_balancing):
        return EXIT_FAILED
    return run_server(config, start, console, say, log_path, quiet)


def prepare_runtime(config: Config, rendered: Rendered, say: Log) -> Starter:
    """Make what the runtime needs (venv, tiny models; for docker the image) and
    return how to start the server on it."""
    if config.runtime == "docker":
        client = require_client()
        image = docker_run.resolve_image(client, config)
        if config.prepare_models in PREPARE_KIND:  # made with the image's own torch: no host venv needed
            docker_run.prepare_tiny_models(client, config, image, log=say)
        return lambda log, echo: docker_run.start_server(
            config, rendered, image=image, log=log, echo=echo, client=client
        )
    prepare(config, log=say)
    return lambda log, echo: LocalServer(rendered, launch_env(config), log, echo)


def run_preflight(config: Config, say: Log, proc_root: Path, dev_root: Path, allow_numa_balancing: bool) -> bool:
    try:
        for check_ in preflight(config, proc_root, dev_root, allow_numa_balancing=allow_numa_balancing):
            say(f"preflight ok  {check_.name}: {check_.detail}")
    except PreflightError as exc:
        for failed in exc.failed:
            say(f"[red]preflight FAILED[/red]  {failed.name}: {failed.detail}\n    fix: {failed.fix}")
        return False
    return True


def run_server(config: Config, start: Starter, console: Console, say: Log, log_path: Path | None, quiet: bool) -> int:
    """Start the server with SIGINT/SIGTERM turned into a stop request, supervise it,
    and leave nothing running and the handlers restored however it ends."""
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        got.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    log = open(log_path, "a") if log_path else None  # noqa: SIM115 - closed by the finally below, after the server
    echo = (
        (lambda line: None)
        if quiet
        else (lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    )
    say(f"starting {config.served_model_name} on {config.base_url} ({config.runtime})")
    try:
        try:
            server = start(log, echo)
        except Exception as exc:  # ContainerError and docker API errors: one line, no traceback
            say(f"[red]could not start the server: {exc}[/red]")
            return EXIT_FAILED
        try:
            return supervise(config, server, console, say, stop, got)
        finally:
            if server.poll() is None:
                server.stop()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if log is not None:
            log.close()
        sys.stdout.flush()


def supervise(config: Config, server: Any, console: Console, say: Log, stop: threading.Event, got: list[int]) -> int:
    """Wait for health, print the ready line, then watch the server until it dies
    (its exit code, or 1) or a signal asks it to stop (0; 130/143 before ready)."""
    t0 = time.monotonic()
    if not wait_healthy(config, server, console, stop):
        if stop.is_set():
            say("interrupted before the server was ready; stopping it")
            server.stop()
            return EXIT_INTERRUPTED if signal.SIGINT in got else EXIT_TERMINATED
        code = server.poll()
        reason = f"exited with code {code}" if code is not None else f"not healthy after {config.health_timeout}s"
        server.stop()
        report_death(server, console, say, reason)
        return EXIT_FAILED
    say(
        f"[green]ready[/green] in {time.monotonic() - t0:.0f}s: {config.base_url}/v1 "
        f"(model {config.served_model_name}); try:"
    )
    console.print(curl_example(config), markup=False, highlight=False, soft_wrap=True)
    while not stop.wait(1.0):
        code = server.poll()
        if code is not None:
            server.stop()
            report_death(server, console, say, f"exited with code {code}")
            return code or 1
    say("stopping the server")
    server.stop()
    return 0


def report_death(server: Any, console: Console, say: Log, reason: str) -> None:
    say(f"[red]server {reason}[/red]; last log lines:")
    for line in server.tail:
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


def print_config(config: Config) -> None:
    table = Table(title=str(config.path), show_lines=False)
    for col in ("key", "value", "from"):
        table.add_column(col, overflow="fold")
    for f in FIELDS:
        value = config.value(f.name)
        table.add_row(f.name, "***" if f.secret and value else str(value), config.sources[f.name])
    Console().print(table)
