"""Running speculators' own commands in its managed venv, output kept in a log file.

Every step the speculators engine takes (prepare-data, generate-offline-data,
train, convert) is speculators' command line, never its Python API: the venv
keeps its pins, and what ran is a command a user can copy from the log.
"""

from __future__ import annotations

import os
import subprocess
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from ...errors import SpeculatorsError
from ...logtail import Log
from .venv import ensure_speculators

TAIL = 25


def speculators_argv(*args: str) -> list[str]:
    """`speculators ARGS...` from the managed venv (made first if needed)."""
    return [str(ensure_speculators()), *args]


def torchrun_argv(nproc_per_node: int, nnodes: int, *args: str, rdzv_endpoint: str | None = None) -> list[str]:
    """`torchrun ... -m speculators.train ARGS...` from the managed venv: the multi-GPU training step
    (across nodes, every node runs it with the first node's `rdzv_endpoint`, host:port)."""
    venv_bin = ensure_speculators().parent
    rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"] if rdzv_endpoint else []
    return [
        str(venv_bin / "torchrun"),
        *rdzv,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "-m",
        "speculators.train",
        *args,
    ]


def run_logged(
    argv: Sequence[str],
    log_path: Path,
    what: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    echo: Log = print,
) -> None:
    """Run `argv`, every line appended to `log_path` and echoed; a failure raises with the log's last lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=TAIL)
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                tail.append(line)
                echo(f"  {what}: {line}")
            code = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0:
        last = "\n".join(tail)
        raise SpeculatorsError(f"{what} failed (exit {code}); its output is in {log_path}; last lines:\n{last}")
