"""What a benchmark asks the server besides its requests: which model it serves
(`/v1/models`, `/version`) and its `/metrics` counters.

Kept apart from the runner because these answers decide what a result file
claims (the model, the server's version, the counter deltas of the window),
while the runner only schedules requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from ..errors import BenchError
from ..paths import portable
from .metrics import GENERATION_TOKENS, Snapshot, server_root


async def identify(
    client: httpx.AsyncClient, base_url: str, model: str | None, headers: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """The server's identity for the result file, and the model to ask for: `model`, or the one
    model the server serves. Refused with the reason when the server cannot be the one meant."""
    url = f"{base_url}/models"
    try:
        r = await client.get(url, headers=headers, timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {base_url}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise BenchError(f"{base_url} refused the API key (HTTP {r.status_code}); pass --api-key")
    models: list[dict[str, Any]] = []
    if r.status_code == 200:
        try:
            models = [m for m in r.json().get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError):
            raise BenchError(f"{url} did not answer with a model list; is --base-url the /v1 root?") from None
    elif r.status_code == 404:
        raise BenchError(f"{url} is 404; is --base-url the OpenAI /v1 root (e.g. http://host:8262/v1)?")
    ids = [str(m.get("id")) for m in models]
    if model is None:
        if len(ids) != 1:
            raise BenchError(f"pass --model: {base_url} serves {', '.join(ids) or 'no models'}")
        model = ids[0]
    elif ids and model not in ids:
        raise BenchError(f"model {model!r} is not served at {base_url}; it serves: {', '.join(ids)}")
    try:
        v = await client.get(server_root(base_url) + "/version", headers=headers, timeout=10.0)
        v.raise_for_status()
        version = v.json()
    except (httpx.HTTPError, ValueError):
        version = None
    info = {
        "base_url": base_url,
        "version": version.get("version") if isinstance(version, dict) else None,
        "models": [
            {
                k: (portable(m[k]) if k == "root" and isinstance(m[k], str) else m[k])
                for k in ("id", "root", "max_model_len", "owned_by")
                if k in m
            }
            for m in models
        ],
    }
    return info, model


# A scrape outside the window may wait and try again: a server on a loaded host can miss one
# 10 s read, and a window without its counters loses the acceptance and the token check.
SCRAPE_TRIES = 3


async def scrape(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], model: str | None, settle_s: float | None = None
) -> Snapshot:
    """One `/metrics` snapshot; with `settle_s`, scraped again until the generation counter holds
    still (a server updates its counters a moment after the last byte is sent), at most that long."""

    async def once() -> Snapshot:
        for attempt in range(1, SCRAPE_TRIES + 1):
            try:
                r = await client.get(url, headers=headers, timeout=10.0)
                break
            except httpx.TransportError:
                if attempt == SCRAPE_TRIES:
                    raise
                await asyncio.sleep(1.0)
        r.raise_for_status()
        return Snapshot.from_text(r.text, time.time(), model)

    snap = await once()
    if settle_s is None:
        return snap
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        nxt = await once()
        if nxt.total(GENERATION_TOKENS) == snap.total(GENERATION_TOKENS) and nxt.counters == snap.counters:
            return nxt
        snap = nxt
    return snap
