"""What FP8 validation asks a live server: greedy outputs and teacher-forced logprobs.

Greedy outputs go through the benchmark's own streamed client
(``bench.client.stream_chat``, with vLLM's ``return_token_ids``), so the token ids
compared are exactly what a user's stream carried. Teacher forcing is one
``/v1/completions`` request per sequence with the token ids as the prompt and
vLLM's ``prompt_logprobs`` extension; on vLLM 0.32 it answers, in
``choices[0].prompt_logprobs``, ``null`` for the first token and then per position
``{token_id: {"logprob", "rank", "decoded_token"}}`` holding the top-k tokens plus the
scored token itself. k is at most the server's ``--max-logprobs`` (vLLM's default
20; a larger request is refused with HTTP 400).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..bench.client import RequestRecord, chat_payload, stream_chat
from ..errors import ServerRequestError

# vLLM's default --max-logprobs: the most a stock server returns per position.
TOP_K = 20


@dataclass(frozen=True)
class Output:
    prompt_id: str
    text: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finish_reason: str | None


async def _generate(
    base_url: str, model: str, prompts: Sequence[tuple[str, str]], max_tokens: int, concurrency: int, timeout: float
) -> list[Output]:
    url = f"{base_url}/v1/chat/completions"
    slots = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, pid: str, text: str) -> Output:
        body = chat_payload(model, [{"role": "user", "content": text}], max_tokens, 0.0)
        async with slots:
            rec = await stream_chat(client, url, body, {}, RequestRecord(0, 0, time.perf_counter()), timeout)
        if not rec.ok:
            raise ServerRequestError(f"prompt {pid}: {rec.error}: {rec.error_detail}")
        if rec.prompt_token_ids is None or rec.token_source != "token_ids":
            raise ServerRequestError(f"prompt {pid}: the server returned no token ids (return_token_ids ignored?)")
        return Output(pid, rec.text, tuple(rec.prompt_token_ids), tuple(rec.token_ids), rec.finish_reason)

    async with httpx.AsyncClient(timeout=timeout) as client:
        return list(await asyncio.gather(*(one(client, pid, text) for pid, text in prompts)))


def generate(
    base_url: str,
    model: str,
    prompts: Sequence[tuple[str, str]],
    max_tokens: int,
    concurrency: int = 4,
    timeout: float = 600.0,
) -> list[Output]:
    """Greedy (temperature 0) chat outputs for (id, user text) prompts, in order."""
    return asyncio.run(_generate(base_url, model, prompts, max_tokens, concurrency, timeout))


def parse_prompt_logprobs(entries: Any, where: str) -> list[dict[int, float] | None]:
    """vLLM's ``prompt_logprobs`` list as {token id: logprob} per position."""
    if not isinstance(entries, list):
        raise ServerRequestError(f"{where}: no prompt_logprobs list in the answer (got {type(entries).__name__})")
    out: list[dict[int, float] | None] = []
    for i, pos in enumerate(entries):
        if pos is None:
            out.append(None)
            continue
        if not isinstance(pos, dict):
            raise ServerRequestError(f"{where}: prompt_logprobs[{i}] is a {type(pos).__name__}, not an object")
        try:
            out.append({int(tok): float(v["logprob"] if isinstance(v, dict) else v) for tok, v in pos.items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerRequestError(f"{where}: prompt_logprobs[{i}] malformed: {exc!r}") from None
    return out


def score(
    base_url: str,
    model: str,
    sequences: Sequence[tuple[str, Sequence[int], int]],
    top_k: int = TOP_K,
    timeout: float = 600.0,
) -> list[list[dict[int, float]]]:
    """Teacher-forced logprobs: for each (id, token ids, start) the {token: logprob}
    of every position from ``start`` on (the distribution that predicted token i
    given tokens before i), one list per sequence, in order."""
    out: list[list[dict[int, float]]] = []
    with httpx.Client(timeout=timeout) as client:
        for pid, ids, start in sequences:
            body = {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k}
            try:
                resp = client.post(f"{base_url}/v1/completions", json=body)
            except httpx.HTTPError as exc:
                raise ServerRequestError(f"prompt {pid}: scoring request failed: {type(exc).__name__}: {exc}") from None
            if resp.status_code != 200:
                raise ServerRequestError(f"prompt {pid}: scoring answered HTTP {resp.status_code}: {resp.text[:200]}")
            choices = resp.json().get("choices") or [{}]
            per_pos = parse_prompt_logprobs(choices[0].get("prompt_logprobs"), f"prompt {pid}")
            if len(per_pos) != len(ids):
                raise ServerRequestError(f"prompt {pid}: {len(per_pos)} prompt_logprobs for {len(ids)} tokens")
            tail = per_pos[start:]
            if any(p is None for p in tail):
                raise ServerRequestError(f"prompt {pid}: a scored position has no logprobs")
            out.append([p for p in tail if p is not None])
    return out
