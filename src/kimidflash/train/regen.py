"""regen: the training prompts answered by the served target.

Each prompt goes to the server's OpenAI chat API (the server applies the chat
template) with `return_token_ids`, so the record holds the exact token ids the
target saw (`prompt_token_ids`) and produced (`choices[0].token_ids`): no
re-tokenisation drift. Sampling (temperature, max_tokens) and concurrency come
from the training config. Resumable: ids already in the output are skipped,
and each finished record is appended and flushed at once.

On the MI300X host the same command regenerates with Kimi K2.6 (point
`regen.base_url` at the running production server, or let it start one from
`target.serve_config`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx

from ..errors import RegenError
from .data import RecordWriter, make_record, read_records
from .progress import bar


async def _regen(
    base_url: str,
    model: str | None,
    todo: Sequence[dict],
    out: Path,
    concurrency: int,
    max_tokens: int,
    temperature: float,
    seed: int,
    timeout: float,
) -> int:
    writer = RecordWriter(out)
    sem = asyncio.Semaphore(concurrency)
    done = 0
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        with bar("regen", len(todo)) as advance:

            async def one(p: dict) -> None:
                nonlocal done
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": p["prompt"]}],
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "seed": seed,
                    "return_token_ids": True,
                }
                async with sem:
                    try:
                        r = await client.post("/v1/chat/completions", json=body)
                        r.raise_for_status()
                        js = r.json()
                    except (httpx.HTTPError, ValueError) as e:
                        failures.append(f"{p['id']}: {e}")
                        advance()
                        return
                ch = js["choices"][0]
                if "prompt_token_ids" not in js or "token_ids" not in ch:
                    raise RegenError(f"{base_url}: response has no token ids (server ignores return_token_ids)")
                writer.write(
                    make_record(
                        p["id"], p["prompt"], js["prompt_token_ids"], ch["token_ids"], ch.get("finish_reason") or ""
                    )
                )
                done += 1
                advance()

            await asyncio.gather(*(one(p) for p in todo))
    writer.close()
    if failures and not done:
        raise RegenError(f"every request failed; first: {failures[0]}")
    return done


def regen(
    base_url: str,
    model: str | None,
    prompts: Sequence[dict],
    out: Path,
    *,
    concurrency: int,
    max_tokens: int,
    temperature: float,
    seed: int = 0,
    timeout: float = 600.0,
    limit: int | None = None,
) -> int:
    """Answer the prompts not yet in `out`; returns how many records were added. `model`: the served
    model name (target.TargetInfo.served_name), sent as null when None."""
    have = {r.id for r in read_records(out)}
    todo = [p for p in prompts if p["id"] not in have]
    if limit is not None:
        todo = todo[:limit]
    if not todo:
        return 0
    return asyncio.run(_regen(base_url, model, todo, out, concurrency, max_tokens, temperature, seed, timeout))
