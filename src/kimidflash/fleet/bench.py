"""`python -m kimidflash fleet-bench CONFIG --out DIR`: what the router costs, and
what a second replica gives, in one run.

Two replicas of CONFIG are served through the recipe's serve path, and two
vllm-routers run in front of them: one over replica a alone (round_robin, so
nothing but the proxy hop differs from a direct connection) and one over both
(consistent_hash, the benchmark sending X-Session-ID). Each round replays the
same sessions

* one request at a time, straight to replica a (`direct-1`) and through the
  one-replica router (`router-1`): the difference in time per request (sent to
  last token) is the router's cost, measured where nothing else moves it;
* at `--concurrency`, straight to a, through the one-replica router and
  through the two-replica router (`router-2`, both replicas' /metrics read as
  one): one replica against two at the same total load.

The result files are the benchmark's own; `router-overhead.json` holds the
per-round differences and ratios, `report.md` the compare tables.

On a machine whose cores the replicas share (this project's CPU reference: 2
cores for two servers), `router-2` measures the router's spreading, not a
second node's capacity; on MI300X each replica is its own 8-GPU node.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ..background import free_port
from ..bench.provenance import local_provenance
from ..errors import FleetError
from ..fsio import read_json_object, write_text_atomic
from ..paths import portable
from .spec import Fleet, Replica, Router

VARIANTS = ("direct-1", "router-1", "router-2")  # in each round, at --concurrency; the first two also at 1


def _router(out: Path, name: str, policy: str, urls: list[str], version: str) -> Fleet:
    return Fleet(
        out / f"{name}.toml",
        Router(
            policy=policy, port=free_port(), prometheus_port=free_port(), health_check_interval_secs=2, version=version
        ),
        [Replica(f"r{i}", url=u) for i, u in enumerate(urls)],
    )


def service_ms(doc: dict) -> list[float]:
    """Each completed request's time from sent to last token (end-to-end minus the
    wait for a concurrency slot, which one-at-a-time sessions spend mostly queued)."""
    return [q["e2el_ms"] - (q.get("slot_wait_ms") or 0.0) for q in doc["requests"] if q.get("e2el_ms") is not None]


def write_overhead(files: list[Path], out: Path, args: argparse.Namespace, argv: list[str]) -> None:
    """Per round: the router's added latency one request at a time (router-1 minus
    direct-1, mean and median time from sent to last token) and the throughput
    ratios at --concurrency."""
    docs = {f.stem: read_json_object(f, "result file", FleetError) for f in files}
    c, rounds = args.concurrency, []
    for r in range(1, args.rounds + 1):
        d1, r1 = docs[f"direct-1-c1-r{r}"], docs[f"router-1-c1-r{r}"]
        dn, rn, r2 = (docs[f"{v}-c{c}-r{r}"] for v in VARIANTS)
        s1, sr = service_ms(d1), service_ms(r1)
        rounds.append(
            {
                "round": r,
                "router_added_ms_mean": round(statistics.mean(sr) - statistics.mean(s1), 2),
                "router_added_ms_median": round(statistics.median(sr) - statistics.median(s1), 2),
                "direct_request_ms_median": round(statistics.median(s1), 2),
                f"router_1_vs_direct_tok_s_c{c}": round(rn["output_throughput"] / dn["output_throughput"], 4),
                f"router_2_vs_direct_tok_s_c{c}": round(r2["output_throughput"] / dn["output_throughput"], 4),
            }
        )
    summary = {
        "provenance": local_provenance(["kimidflash", "fleet-bench", *argv]),
        "config": portable(args.config),
        "settings": {
            k: getattr(args, k) for k in ("rounds", "sessions", "turns", "concurrency", "max_tokens", "router_version")
        },
        "files": sorted(f.name for f in files),
        "rounds": rounds,
        "median": {k: statistics.median(x[k] for x in rounds) for k in rounds[0] if k != "round"},
    }
    write_text_atomic(out / "router-overhead.json", json.dumps(summary, indent=2) + "\n")
