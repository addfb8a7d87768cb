"""CPU time a local server's own processes spend inside the measured window, per process.

Why: where the benchmark client, vLLM's API server, its engine core and the model's
worker share a few cores (the CPU reference's two, or a GPU host whose API server
is the bottleneck at high concurrency), a change that costs the worker nothing can
still cost throughput in the host processes, and the reverse. A token rate cannot
say which process pays; CPU seconds per output token, per process, can.

Only for a server on this host whose launcher pid is known (`kimidflash ab` passes
the one it started; `kimidflash bench --server-pid`); the tree is that process and
its descendants, read with psutil.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import psutil

VLLM_TITLE = "VLLM::"  # vLLM names its engine core and worker processes so (setproctitle)
LAUNCHERS = ("kimidflash", "serve.sh", "kimi26-vllm-dflash.sh")  # what starts vLLM here, by file name


def role(cmdline: list[str], name: str) -> str:
    """What a process of the tree is: vLLM's own title for its engine core and workers,
    else the launcher (`kimidflash serve`, serve.sh, the launcher script), else the API
    server (`vllm serve`, or python -m vllm.entrypoints...), else the executable's name.
    Judged by program and module names, never by paths: a venv's path may say anything."""
    head = cmdline[0] if cmdline else ""
    if head.startswith(VLLM_TITLE):
        return head.split()[0]
    args = cmdline[:3]
    programs = [os.path.basename(a) for a in args]
    modules = [b for a, b in zip(args, args[1:], strict=False) if a == "-m"]
    if any(m.split(".")[0] == "kimidflash" for m in modules) or any(p in LAUNCHERS for p in programs):
        return "launcher"
    if any(m.startswith("vllm") for m in modules) or "vllm" in programs:
        return "api server"
    return name


@dataclass
class Snapshot:
    """Cumulative CPU seconds (user + system) of each process in the tree, and of the host."""

    root_pid: int
    processes: dict[int, tuple[str, float]] = field(default_factory=dict)
    host_busy: float = 0.0
    host_total: float = 0.0


def snapshot(root_pid: int) -> Snapshot:
    """The tree under `root_pid` now; processes that exit while it is read are left out."""
    snap = Snapshot(root_pid)
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                snap.processes[p.pid] = (role(p.cmdline(), p.name()), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    host = psutil.cpu_times()
    snap.host_total = sum(host)
    snap.host_busy = snap.host_total - host.idle - getattr(host, "iowait", 0.0)
    return snap


def summary(before: Snapshot, after: Snapshot, duration: float, output_tokens: int) -> dict[str, Any]:
    """The result file's `server_cpu`: per process its CPU seconds in the window, its share
    of one core and its milliseconds per output token, busiest first; and how busy the
    whole host was (every core, the client and anything else included)."""

    def per_token(seconds: float) -> float | None:
        return round(1000 * seconds / output_tokens, 4) if output_tokens else None

    rows: list[dict[str, Any]] = []
    for pid, (name, cpu) in after.processes.items():
        if pid not in before.processes:
            continue  # started inside the window: its time before is unknown
        spent = cpu - before.processes[pid][1]
        rows.append(
            {
                "process": name,
                "pid": pid,
                "cpu_seconds": round(spent, 3),
                "utilization": round(spent / duration, 3) if duration > 0 else None,
                "ms_per_output_token": per_token(spent),
            }
        )
    rows.sort(key=lambda r: -r["cpu_seconds"])
    span = after.host_total - before.host_total
    total = sum(r["cpu_seconds"] for r in rows)
    return {
        "root_pid": before.root_pid,
        "processes": rows,
        "total_cpu_seconds": round(total, 3),
        "total_ms_per_output_token": per_token(total),
        "host_cores": psutil.cpu_count(),
        "host_busy_fraction": round((after.host_busy - before.host_busy) / span, 3) if span > 0 else None,
    }
