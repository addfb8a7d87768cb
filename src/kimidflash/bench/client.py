"""One streamed chat completion, timed token by token.

Why this is careful:
- Token counts come from the server: each chunk's `token_ids` (vLLM's
  `return_token_ids`), else the change in `usage.completion_tokens` when the
  server sent usage on every chunk (vLLM's `continuous_usage_stats`), else, as
  a last resort, one token per text chunk (marked `token_source="chunks"`: the
  ITLs are then the gaps between content chunks, one per chunk, not per token).
  A usage sent once, with the total (on a usage-only, the last content or a
  finish-only chunk), is never booked onto one chunk.
  The request's total is always the final `usage.completion_tokens`; a stream
  without usage is an error (`no_usage`), never a guess.
- Under speculative decoding one SSE chunk carries several tokens. A chunk of
  n tokens arriving `dt` after the previous token-bearing chunk yields n
  intervals of `dt / n`; extra tokens in the *first* token-bearing chunk
  arrived together with the first token and get intervals of 0. So
  sum(ITL) = last token time - first token time and len(ITL) = tokens - 1.
- The role-only first chunk (and any chunk without tokens) is not an interval.
- All times are `time.perf_counter()` seconds; `due` is when the request
  should have been sent, so latency includes any wait for a concurrency slot.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# Token-count sources from best to worst; a request reports its worst.
SOURCES = ("token_ids", "usage", "chunks")


@dataclass
class RequestRecord:
    session: int
    turn: int
    due: float
    warmup: bool = False
    sent: float | None = None
    first_token: float | None = None
    end: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # final usage.completion_tokens
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens) per token-bearing chunk
    token_source: str = ""
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    error_detail: str | None = None
    spec_decode: dict[str, Any] | None = None
    # The ids themselves (vLLM's return_token_ids): what FP8 validation compares.
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    # Streamed tool calls, joined by index: {"name", "arguments"} (the arguments' JSON text).
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    problem: str | None = None  # why a finished structured reply is not what was asked (workloads.py)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.output_tokens is not None

    @property
    def reply(self) -> str:
        """The answer as the next turn carries it back: its text, or a tool call's arguments (the next
        turn needs no tool result to go on)."""
        return self.text or "".join(c["arguments"] for c in self.tool_calls)

    @property
    def slot_wait(self) -> float | None:
        return None if self.sent is None else self.sent - self.due

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.due

    @property
    def e2el(self) -> float | None:
        return None if self.end is None else self.end - self.due

    @property
    def itls(self) -> list[float]:
        return split_itls(self.chunks)

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (tokens - 1): time per output token after the first."""
        if self.output_tokens is None or self.output_tokens < 2 or self.e2el is None or self.ttft is None:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def chunk_token_total(self) -> int:
        return sum(n for _, n in self.chunks)


def split_itls(chunks: list[tuple[float, int]]) -> list[float]:
    """Per-token inter-token latencies from (arrival time, token count) chunks."""
    out: list[float] = []
    prev: float | None = None
    for t, n in chunks:
        if n <= 0:
            continue
        if prev is None:
            out.extend([0.0] * (n - 1))
        else:
            out.extend([(t - prev) / n] * n)
        prev = t
    return out


def chat_payload(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float,
    vllm_extensions: bool = True,
    ignore_eos: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request body. `vllm_extensions` adds `return_token_ids` and
    `continuous_usage_stats` (exact per-chunk token counts); turn it off for
    servers that reject unknown fields."""
    stream_options: dict[str, Any] = {"include_usage": True}
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": stream_options,
    }
    if vllm_extensions:
        stream_options["continuous_usage_stats"] = True
        body["return_token_ids"] = True
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body


def worse_source(a: str, b: str) -> str:
    """The less exact of two token-count sources ("" is no source yet): a request,
    and a run, report the worst source any of its counts came from."""
    if not a:
        return b
    return a if SOURCES.index(a) >= SOURCES.index(b) else b


def error_kind(exc: BaseException) -> str:
    """A stable, countable name for what went wrong."""
    if isinstance(exc, (asyncio.TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout)):
        return "timeout"
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "disconnect"
    if isinstance(exc, httpx.HTTPError):
        return "http_error"
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return "bad_response"
    return "client_error"


CONNECTION_ERRORS = frozenset({"connect", "connect_timeout", "disconnect"})


class _Stream:
    """What one response's SSE events have told so far.

    Per-chunk token counts are decided once the stream is over (`finish`): usage
    deltas count only when the server sent usage on every token-bearing chunk
    (continuous usage stats); a usage that arrives once, with the total (on the
    last content chunk or on a finish-only chunk), gives the request's total and
    nothing per chunk."""

    def __init__(self, rec: RequestRecord):
        self.rec = rec
        self.parts: list[str] = []
        self.last_usage_completion = 0
        self.usage_events = 0
        self.done = False
        self.finished = False
        # per candidate chunk: (arrival, token ids or None, usage delta or None, text choices)
        self.pending: list[tuple[float, int | None, int | None, int]] = []

    def event(self, data: bytes, now: float) -> bool:
        """Take one `data:` payload; True when the stream is over ([DONE] or an error event)."""
        rec = self.rec
        if data == b"[DONE]":
            self.done = True
            rec.end = now
            return True
        obj = json.loads(data)
        if not isinstance(obj, dict):
            return False
        if "error" in obj and not obj.get("choices"):
            rec.end = now
            rec.error = "server_error_event"
            rec.error_detail = json.dumps(obj["error"])[:300]
            return True
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        metrics = obj.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            rec.spec_decode = metrics["speculative_decoding"]
        if isinstance(obj.get("prompt_token_ids"), list):
            rec.prompt_token_ids = obj["prompt_token_ids"]
        ids: int | None = None
        texts = 0
        for c in obj.get("choices") or []:
            delta = c.get("delta") or {}
            text = delta.get("content") or ""
            thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if text:
                self.parts.append(text)
            for call in delta.get("tool_calls") or []:
                thought = self._tool_call(call) or thought
            if c.get("finish_reason"):
                rec.finish_reason = c["finish_reason"]
            tids = c.get("token_ids")
            if isinstance(tids, list):
                ids = (ids or 0) + len(tids)
                rec.token_ids.extend(tids)
            if text or thought:
                texts += 1
        used: int | None = None
        if usage is not None:
            if isinstance(usage.get("completion_tokens"), int):
                used = usage["completion_tokens"] - self.last_usage_completion
                self.last_usage_completion = usage["completion_tokens"]
                self.usage_events += 1
                rec.output_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                rec.prompt_tokens = usage["prompt_tokens"]
        if ids or texts or (used and obj.get("choices")):
            self.pending.append((now, ids, used, texts))
        rec.end = now
        return False

    def _tool_call(self, call: Any) -> str:
        """Join one streamed tool-call delta onto its call (by index); its argument text, which counts
        as text for the chunk fallback."""
        if not isinstance(call, dict):
            return ""
        calls = self.rec.tool_calls
        i = call["index"] if isinstance(call.get("index"), int) else len(calls) - 1
        while len(calls) <= max(i, 0):
            calls.append({"name": "", "arguments": ""})
        fn = call["function"] if isinstance(call.get("function"), dict) else {}
        calls[i]["name"] += fn.get("name") or ""
        args = fn.get("arguments") or ""
        calls[i]["arguments"] += args
        return args

    def finish(self) -> None:
        """Turn the candidate chunks into (arrival, tokens) chunks, each count from
        per-chunk data only: token ids, else usage deltas when usage came with every
        chunk, else one per text chunk (`chunks`: the total is still usage's)."""
        if self.finished:
            return
        self.finished = True
        rec = self.rec
        per_chunk_usage = self.usage_events >= 2 and all(u is not None for _, _, u, _ in self.pending)
        for now, ids, used, texts in self.pending:
            if ids is not None:
                n, source = ids, "token_ids"
            elif per_chunk_usage and used is not None:
                n, source = used, "usage"
            else:
                n, source = texts, "chunks"
            if n <= 0:
                continue
            if rec.first_token is None:
                rec.first_token = now
            rec.chunks.append((now, n))
            rec.token_source = worse_source(rec.token_source, source)


async def _consume(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], stream: _Stream
) -> None:
    rec = stream.rec
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            rec.end = time.perf_counter()
            rec.error = f"http_{resp.status_code}"
            rec.error_detail = raw[:300].decode("utf-8", "replace")
            return
        # SSE framing on bytes: httpx's text and line decoders cost more CPU per
        # chunk than the JSON, and the client's CPU is taken from the server's
        # when both share a small machine.
        pending = b""
        async for raw in resp.aiter_bytes():
            now = time.perf_counter()
            *lines, pending = (pending + raw).split(b"\n")
            # blank separators, comments and `event:` lines carry no data
            if any(line.startswith(b"data:") and stream.event(line[5:].strip(), now) for line in lines):
                break
    stream.finish()
    if rec.error:
        return
    rec.text = "".join(stream.parts)
    if not stream.done:
        rec.error = "incomplete_stream"
        rec.error_detail = "the stream ended without [DONE]"
    elif rec.output_tokens is None:
        rec.error = "no_usage"
        rec.error_detail = "no usage in the stream (stream_options.include_usage ignored?)"


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rec: RequestRecord,
    timeout: float,
) -> RequestRecord:
    """Send one request and fill `rec`; never raises for request failures
    (they become `rec.error`), only for cancellation."""
    rec.sent = time.perf_counter()
    stream = _Stream(rec)
    try:
        await asyncio.wait_for(_consume(client, url, body, headers, stream), timeout)
    except asyncio.CancelledError:
        stream.finish()
        rec.error = rec.error or "cancelled"
        rec.end = rec.end or time.perf_counter()
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none is fatal
        rec.error = error_kind(exc)
        rec.error_detail = f"{type(exc).__name__}: {exc}"[:300]
        rec.end = time.perf_counter()
        stream.finish()
    return rec
