"""The regen's throughput against the server's own: `kimidflash bench` on the same server, at the
regen's concurrency, on the requests this run kept, answered greedily to the regen's answer cap.

Why: a self-synthesis run is worth its hours only if it keeps the server about as busy as a
plain benchmark would. Its own tok/s (users and answers, refused ones included, over each
shard's wall time) is set beside the benchmark's output tok/s on the same server right after,
so the two share the machine's state; their ratio is what the manifest keeps, with the result
file it came from.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..bench.resultfile import write_result
from ..bench.runner import run_benchmark
from ..bench.settings import BenchConfig
from ..errors import DataError
from ..fsio import write_json_atomic
from ..paths import portable
from .data import SHARDS_MANIFEST, read_shard
from .selfsynth import Settings


def regen_rate(entries: Sequence[dict[str, Any]]) -> float:
    """Generated tokens over wall seconds, pooled over `entries` (manifest shard entries)."""
    seconds = sum(e["seconds"] for e in entries)
    if not entries or seconds <= 0:
        raise DataError("no shard with a measured time to set beside the benchmark")
    return sum(e["generated_tokens"] for e in entries) / seconds


def users_jsonl(out: Path, entries: Sequence[dict[str, Any]], path: Path) -> int:
    """The kept requests of `entries`' shards as the benchmark's prompt JSONL; how many."""
    n = 0
    with path.open("w") as f:
        for e in entries:
            for rec in read_shard(out / e["file"]):
                f.write(json.dumps({"id": rec.id, "kind": "selfsynth", "turns": [rec.prompt]}) + "\n")
                n += 1
    return n


def bench_beside(
    base_url: str,
    out: Path,
    manifest: dict[str, Any],
    first: int,
    settings: Settings,
    concurrency: int,
    result: Path,
    argv: Sequence[str] = (),
) -> dict[str, Any]:
    """Benchmark the server on shards `first`.. of `manifest`, write the result file, and record
    {regen, server, ratio} in the manifest under `throughput` (returned)."""
    entries = manifest["shards"][first:]
    regen = regen_rate(entries)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "users.jsonl"
        sessions = users_jsonl(out, entries, prompts)
        if sessions < concurrency:
            raise DataError(f"{sessions} kept requests cannot keep {concurrency} in flight: add shards")
        cfg = BenchConfig(
            base_url=base_url.rstrip("/") + "/v1",
            model=settings.model,
            sessions=sessions,
            concurrency=concurrency,
            max_tokens=settings.answer_max_tokens,
            prompts=str(prompts),
            label="selfsynth-server",
            argv=list(argv),
        )
        doc = run_benchmark(cfg)
    write_result(result, doc)
    server = doc["output_throughput"]
    if not server:
        raise DataError(f"{result}: the benchmark completed no request")
    throughput = {
        "shards": [e["file"] for e in entries],
        "concurrency": concurrency,
        "regen_output_tok_s": round(regen, 1),
        "server_output_tok_s": round(server, 1),
        "regen_vs_server": round(regen / server, 3),
        "result": portable(result),
    }
    manifest["throughput"] = throughput
    write_json_atomic(out / SHARDS_MANIFEST, manifest)
    return throughput
