"""What one run is asked to do: the options of `benchmark_multi_turn.py`, checked.

Kept apart from the runner so that callers that only build or record a
configuration (the command line, the A/B campaign, FP8 validation) name it
without the machinery that executes it, and so the result file's `config`
section is defined in one place (`public`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from ..errors import BenchError
from ..paths import portable
from .prompts import BUILTIN
from .workloads import NO_IGNORE_EOS, WORKLOADS


@dataclass
class BenchConfig:
    base_url: str
    model: str | None = None  # None: the recipe config's SERVED_MODEL_NAME, else the server's only model
    sessions: int = 32
    turns_per_session: int = 1
    concurrency: int | None = None  # default: sessions
    max_tokens: int = 512
    temperature: float = 0.0
    warmup: int = 2
    warmup_max_tokens: int = 16
    seed: int = 0
    prompts: str | None = None  # None/"builtin" or a JSONL / ShareGPT file
    kind: str | None = None  # only the source's conversations of this kind (their `kind`/`category` field)
    category: str | None = None  # the report category this run measures (`kimidflash ab --category`)
    workload: str = "free"  # what each request asks for besides its messages (workloads.py)
    system_prompt: str | None = None
    think_time: float = 0.0
    timeout: float = 600.0
    api_key: str | None = None
    label: str | None = None
    scrape_metrics: bool = True
    # None: <server root>/metrics. Several: a fleet behind a router, read as one
    # (counters summed) with each server's share.
    metrics_urls: list[str] | None = None
    session_header: str | None = None  # e.g. X-Session-ID: each session's requests carry its id
    vllm_extensions: bool = True
    ignore_eos: bool = False
    recipe_config: str | None = None
    recipe_overrides: dict[str, str] | None = None  # the --set KEY=VALUE the server was launched with
    speculative: bool | None = None  # None: from the recipe config, else from /metrics
    server_pid: int | None = None  # a local server's launcher: its process tree's CPU time goes in the result
    max_connection_errors: int = 3
    metrics_settle_timeout: float = 5.0
    progress: bool = False
    handle_signals: bool = False
    argv: Sequence[str] | None = None

    def checked(self) -> BenchConfig:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise BenchError(msg)

        url = self.base_url.strip()
        need(
            url.startswith(("http://", "https://")) and len(url) > len("http://"),
            f"--base-url must be an http(s) URL like http://127.0.0.1:8262/v1, got {self.base_url!r}",
        )
        need(self.sessions >= 1, f"--sessions must be at least 1, got {self.sessions}")
        need(self.turns_per_session >= 1, f"--turns-per-session must be at least 1, got {self.turns_per_session}")
        need(
            self.concurrency is None or self.concurrency >= 1,
            f"--concurrency must be at least 1, got {self.concurrency}",
        )
        need(self.max_tokens >= 1, f"--max-tokens must be at least 1, got {self.max_tokens}")
        need(self.warmup >= 0, f"--warmup must be 0 or more, got {self.warmup}")
        need(self.warmup_max_tokens >= 1, f"--warmup-max-tokens must be at least 1, got {self.warmup_max_tokens}")
        need(
            self.max_connection_errors >= 1,
            f"--max-connection-errors must be at least 1, got {self.max_connection_errors}",
        )
        need(self.timeout > 0, f"--timeout must be positive, got {self.timeout}")
        need(self.think_time >= 0, f"--think-time must be 0 or more, got {self.think_time}")
        need(
            self.server_pid is None or (self.server_pid > 0 and psutil.pid_exists(self.server_pid)),
            f"--server-pid {self.server_pid}: no such process on this host",
        )
        need(self.temperature >= 0, f"--temperature must be 0 or more, got {self.temperature}")
        need(self.workload in WORKLOADS, f"--workload {self.workload!r}: known are {', '.join(WORKLOADS)}")
        need(
            not (self.ignore_eos and WORKLOADS[self.workload].structured),
            f"--ignore-eos with --workload {self.workload}: {NO_IGNORE_EOS}",
        )
        return dataclasses.replace(self, base_url=url.rstrip("/"), concurrency=self.concurrency or self.sessions)

    def public(self) -> dict[str, Any]:
        """The run's settings for the result file (no API key)."""
        d = dataclasses.asdict(self)
        for k in ("api_key", "argv", "progress", "handle_signals"):
            d.pop(k, None)
        d["api_key_set"] = bool(self.api_key)
        d["prompts"] = portable(self.prompts or BUILTIN)
        d["recipe_config"] = portable(self.recipe_config) if self.recipe_config else self.recipe_config
        if self.recipe_overrides:
            d["recipe_overrides"] = {k: portable(v) for k, v in self.recipe_overrides.items()}
        return d
