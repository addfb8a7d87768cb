"""Sessions, concurrency slots, warm-up and the measured window.

Model: every session is a user who sends its turns one after another, keeping
the conversation history (the server's own answers). A turn is *due* when the
session is ready to send it: at the start of the window for the first turn,
and `think_time` after the previous answer for the next ones. At most
`concurrency` requests are in flight; a due request waits for a slot, and
that wait is part of its TTFT and latency (and reported alone as
`slot_wait_ms`), so an overloaded client cannot hide queueing.

Measured window: warm-up requests run first and are excluded; `/metrics` is
scraped after warm-up and again once the last request finished and the
server's generation counter stopped moving. Nothing else should talk to the
server meanwhile, or its counters will not match ours.

Failures never stop a run. A run stops early (partial result) on Ctrl-C /
SIGTERM, or when `max_connection_errors` connection failures happen in a row
(the server is gone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import BenchError, MetricsError, PromptError
from ..fsio import utc_now
from . import hostcpu, server
from . import prompts as prompt_mod
from .client import CONNECTION_ERRORS, RequestRecord, chat_payload, stream_chat
from .metrics import Snapshot, delta, merged, metrics_url_for, spec_decode_stats
from .provenance import local_provenance, recipe_info
from .result import RunData, build_result, default_label
from .settings import BenchConfig
from .workloads import workload

__all__ = ["BenchConfig", "BenchError", "Runner", "arun_benchmark", "run_benchmark"]


# A kept-alive connection is dropped after this many idle seconds, well inside the 5 s after which
# vLLM's uvicorn closes one (VLLM_HTTP_TIMEOUT_KEEP_ALIVE). At httpx's default, also 5 s, a request
# sent as the server closes its connection fails with "Server disconnected without sending a
# response": a request error the server never saw.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass
class _State:
    records: list[RequestRecord] = field(default_factory=list)
    warmup: list[RequestRecord] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    interrupted: bool = False
    consecutive_conn_errors: int = 0


@dataclass
class _Window:
    """What the measured window gave: the server's identity, the two /metrics
    scrapes around the window (or why one is missing) and its times."""

    server: dict[str, Any] | None = None
    metrics_urls: list[str] = dataclasses.field(default_factory=list)
    before: dict[str, Snapshot] = dataclasses.field(default_factory=dict)
    after: dict[str, Snapshot] = dataclasses.field(default_factory=dict)
    metrics_error: str | None = None
    replica_errors: dict[str, str] = dataclasses.field(default_factory=dict)  # a fleet's servers that dropped out
    start_utc: str | None = None
    t0: float | None = None  # perf_counter at the start of the window
    t_end: float | None = None
    client_cpu: float | None = None
    server_cpu: tuple[hostcpu.Snapshot, hostcpu.Snapshot] | None = None  # `server_pid`'s tree, around the window


class Runner:
    def __init__(self, cfg: BenchConfig):
        self.cfg = cfg.checked()
        self.workload = workload(self.cfg.workload)
        self.st = _State()
        self.headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._progress: Any = None
        self._task_id: Any = None

    # --- stopping ----------------------------------------------------------------------
    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop now: no new requests, in-flight ones cancelled; the result is partial."""
        if self.st.reason is None:
            self.st.reason = reason
        self.st.interrupted = True
        self.st.stop.set()
        for t in list(self.st.tasks):
            t.cancel()

    def _abort(self, reason: str) -> None:
        """Stop sending; in-flight requests finish (or fail) by themselves."""
        if self.st.reason is None:
            self.st.reason = reason
        self.st.stop.set()

    def _note(self, rec: RequestRecord) -> None:
        if rec.error in CONNECTION_ERRORS:
            self.st.consecutive_conn_errors += 1
            if self.st.consecutive_conn_errors >= self.cfg.max_connection_errors:
                self._abort(
                    f"server unreachable: {self.st.consecutive_conn_errors} connection "
                    f"failures in a row (last: {rec.error_detail})"
                )
        elif rec.error is None:
            self.st.consecutive_conn_errors = 0
            if not rec.warmup:
                rec.problem = self.workload.problem(rec.text, rec.tool_calls, rec.finish_reason)
        if self._progress is not None and not rec.warmup:
            failed = sum(1 for r in self.st.records if r.error and r.error != "cancelled")
            self._progress.update(self._task_id, advance=1, description=f"requests (errors {failed})")

    # --- requests ----------------------------------------------------------------------
    def _body(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        c = self.cfg
        assert c.model is not None
        return chat_payload(
            c.model, messages, max_tokens, c.temperature, c.vllm_extensions, c.ignore_eos, self.workload.fields
        )

    async def _request(
        self,
        client: httpx.AsyncClient,
        slots: asyncio.Semaphore,
        rec: RequestRecord,
        messages: list[dict[str, str]],
        max_tokens: int,
    ) -> RequestRecord:
        headers = self.headers
        if self.cfg.session_header and not rec.warmup:
            headers = {**headers, self.cfg.session_header: f"session-{self.cfg.seed}-{rec.session}"}
        async with slots:
            if self.st.stop.is_set():
                raise asyncio.CancelledError
            await stream_chat(
                client,
                f"{self.cfg.base_url}/chat/completions",
                self._body(messages, max_tokens),
                headers,
                rec,
                self.cfg.timeout,
            )
        self._note(rec)
        return rec

    def _start_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []

    async def _session(
        self, client: httpx.AsyncClient, slots: asyncio.Semaphore, sid: int, turns: list[str], t0: float
    ) -> None:
        messages = self._start_messages()
        due = t0
        for k, user in enumerate(turns):
            if self.st.stop.is_set():
                return
            if due > time.perf_counter():
                await asyncio.sleep(due - time.perf_counter())
            messages.append({"role": "user", "content": self.workload.user(user)})
            rec = RequestRecord(session=sid, turn=k, due=due)
            self.st.records.append(rec)
            try:
                await self._request(client, slots, rec, messages, self.cfg.max_tokens)
            except asyncio.CancelledError:
                if rec.sent is None:
                    self.st.records.remove(rec)  # never sent: not started, not failed
                raise
            if not rec.ok:
                return  # the conversation cannot go on without the answer
            messages.append({"role": "assistant", "content": rec.reply})
            due = (rec.end or time.perf_counter()) + self.cfg.think_time

    async def _gather(self, coros: list[Any]) -> None:
        tasks = [asyncio.ensure_future(c) for c in coros]
        self.st.tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self.st.tasks.difference_update(tasks)

    async def _warmup(self, client: httpx.AsyncClient, slots: asyncio.Semaphore, prompts: list[str]) -> None:
        async def one(i: int, text: str) -> None:
            rec = RequestRecord(session=-1, turn=i, due=time.perf_counter(), warmup=True)
            self.st.warmup.append(rec)
            try:
                first = {"role": "user", "content": self.workload.user(text)}
                await self._request(client, slots, rec, self._start_messages() + [first], self.cfg.warmup_max_tokens)
            except asyncio.CancelledError:
                pass

        await self._gather([one(i, p) for i, p in enumerate(prompts)])
        self.st.consecutive_conn_errors = 0

    # --- the run -----------------------------------------------------------------------
    def _install_signals(self) -> list[int]:
        if not self.cfg.handle_signals:
            return []
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
        return installed

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        self.interrupt(f"interrupted by {name}")
        # A second Ctrl-C kills the process the usual way.
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(sig)

    async def run(self) -> dict[str, Any]:
        """Inputs, then the measured window, then the result document. A single
        Ctrl-C (with `handle_signals`) ends the window early; the result is partial."""
        recipe, session_prompts, warm_prompts = self._inputs()
        installed = self._install_signals()
        try:
            window = await self._measure(session_prompts, warm_prompts)
        finally:
            self._stop_progress()
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self._summarise(recipe, window)

    def _inputs(self) -> tuple[dict[str, Any] | None, list[list[str]], list[str]]:
        """The recipe config that launched the server (it may name the model) and
        the prompts: every session's turns, and the warm-up prompts kept apart."""
        cfg = self.cfg
        try:
            recipe = recipe_info(cfg.recipe_config, cfg.recipe_overrides)
        except FileNotFoundError as e:
            raise BenchError(str(e)) from None
        except Exception as e:  # the config loader's errors already name key and file
            raise BenchError(f"recipe config {cfg.recipe_config}: {e}") from None
        if recipe and cfg.model is None:
            cfg = self.cfg = dataclasses.replace(cfg, model=recipe["values"].get("SERVED_MODEL_NAME") or None)
        try:
            convs = prompt_mod.of_kind(prompt_mod.load_source(cfg.prompts), cfg.kind)
        except (PromptError, OSError) as e:
            raise BenchError(str(e)) from None
        session_prompts, warm_prompts = prompt_mod.session_turns(
            convs, cfg.sessions, cfg.turns_per_session, cfg.seed, reserve=cfg.warmup
        )
        return recipe, session_prompts, warm_prompts

    async def _measure(self, session_prompts: list[list[str]], warm_prompts: list[str]) -> _Window:
        """Preflight, warm-up, /metrics before, every session, /metrics after (settled)."""
        cfg = self.cfg
        concurrency = cfg.concurrency
        assert concurrency is not None
        limits = httpx.Limits(
            max_connections=concurrency + 4,
            max_keepalive_connections=concurrency + 4,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        timeout = httpx.Timeout(connect=10.0, read=cfg.timeout, write=30.0, pool=None)
        w = _Window(metrics_urls=list(cfg.metrics_urls or [metrics_url_for(cfg.base_url)]))
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
            w.server, model = await server.identify(client, cfg.base_url, cfg.model, self.headers)
            cfg = self.cfg = dataclasses.replace(cfg, model=model)
            slots = asyncio.Semaphore(concurrency)
            if warm_prompts and not self.st.stop.is_set():
                await self._warmup(client, slots, warm_prompts)
            if cfg.scrape_metrics:
                await self._scrape_all(client, w, "before")
            if not self.st.stop.is_set():
                self._start_progress(cfg.sessions * cfg.turns_per_session)
                w.start_utc = utc_now()
                w.t0 = time.perf_counter()
                cpu0 = time.process_time()
                tree0 = hostcpu.snapshot(cfg.server_pid) if cfg.server_pid else None
                await self._gather(
                    [self._session(client, slots, s, turns, w.t0) for s, turns in enumerate(session_prompts)]
                )
                w.client_cpu = time.process_time() - cpu0
                if tree0 is not None:
                    w.server_cpu = (tree0, hostcpu.snapshot(tree0.root_pid))
                ends = [r.end for r in self.st.records if r.end is not None]
                w.t_end = max(ends) if ends else time.perf_counter()
            if w.before and w.t0 is not None:
                await self._scrape_all(client, w, "after")
                if not w.after:
                    self.st.reason = self.st.reason or f"server unreachable after the run ({w.metrics_error})"
        return w

    async def _scrape_all(self, client: httpx.AsyncClient, w: _Window, when: str) -> None:
        """Every /metrics URL of the window (after: those that answered before). A
        fleet's server that fails drops out of the window, named in replica_errors;
        the window fails only when none answers."""
        urls = w.metrics_urls if when == "before" else list(w.before)
        got = w.before if when == "before" else w.after
        errors: list[str] = []
        for url in urls:
            try:
                # settle: warm-up tokens must land before the window, not in it
                settle = when == "after" or bool(self.st.warmup)
                got[url] = await server.scrape(
                    client, url, self.headers, self.cfg.model, self.cfg.metrics_settle_timeout if settle else None
                )
            except (httpx.HTTPError, MetricsError) as e:
                errors.append(f"{when} the window: {type(e).__name__}: {e}")
                if len(w.metrics_urls) > 1:
                    w.replica_errors[url] = errors[-1]
        if errors and not got:
            w.metrics_error = errors[0]

    def _summarise(self, recipe: dict[str, Any] | None, w: _Window) -> dict[str, Any]:
        """Counter deltas, whether the run was speculative, why it is partial, and the document."""
        cfg = self.cfg
        deltas = {url: delta(w.before[url], w.after[url]) for url in w.after}
        d = (
            None
            if not deltas
            else (next(iter(deltas.values())) if len(w.metrics_urls) == 1 else merged(deltas.values()))
        )
        spec = spec_decode_stats(d) if d is not None else None
        speculative = cfg.speculative
        if speculative is None and recipe is not None:
            speculative = recipe["speculative"]
        if speculative is None and d is not None:
            speculative = spec is not None
        notes: list[str] = []
        if d is not None and d.reset:
            notes.append("server counters went backwards (restart?): " + ", ".join(d.reset))
            self.st.reason = self.st.reason or "server counters reset during the run"
        for url, err in w.replica_errors.items():
            notes.append(f"{url} dropped out of the fleet's counters ({err}); its tokens are not in the totals")
        if self.st.interrupted and w.t0 is None:
            self.st.reason = self.st.reason or "interrupted before the measured window"
        prov = local_provenance(cfg.argv)
        prov.update({"server": w.server, "model": cfg.model, "recipe_config": recipe})
        run = RunData(
            config=cfg.public(),
            provenance=prov,
            label=cfg.label or default_label(recipe, speculative, spec),
            speculative=speculative,
            planned_requests=cfg.sessions * cfg.turns_per_session,
            records=self.st.records,
            warmup=self.st.warmup,
            t0=w.t0,
            t_end=w.t_end,
            start_utc=w.start_utc,
            metrics_urls=w.metrics_urls if cfg.scrape_metrics else None,
            metrics_error=w.metrics_error,
            replica_deltas=deltas if len(w.metrics_urls) > 1 else None,
            replica_errors=w.replica_errors,
            metrics_delta=d,
            spec=spec,
            partial=self.st.reason is not None,
            partial_reason=self.st.reason,
            notes=notes,
            client_cpu_seconds=w.client_cpu,
            server_cpu=w.server_cpu,
        )
        return build_result(run)

    # --- progress ----------------------------------------------------------------------
    def _start_progress(self, total: int) -> None:
        if not self.cfg.progress:
            return
        # stderr: stdout stays free for whatever a caller pipes
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
            console=Console(stderr=True),
        )
        self._progress.start()
        self._task_id = self._progress.add_task("requests (errors 0)", total=total)

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


async def arun_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Run one benchmark and return the result document (not yet written)."""
    return await Runner(cfg).run()


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Synchronous `arun_benchmark`: what scripts and the slow tests call."""
    return asyncio.run(arun_benchmark(cfg))
