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

import contextlib
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from ..background import free_port, serving_process
from ..bench.provenance import local_provenance
from ..bench.report import compare
from ..bench.resultfile import write_result
from ..bench.runner import BenchConfig, run_benchmark
from ..errors import FleetError
from ..fsio import read_json_object, write_text_atomic
from ..paths import portable
from .router import SESSION_HEADER
from .run import router_process, wait_healthy
from .spec import Fleet, Replica, Router
from .venv import ensure_router

VARIANTS = ("direct-1", "router-1", "router-2")  # in each round, at --concurrency; the first two also at 1


@dataclass(frozen=True)
class FleetBenchOptions:
    """What one `fleet-bench` run is asked to do (the defaults are the command line's)."""

    config: str
    out: Path
    rounds: int = 3
    sessions: int = 16
    turns: int = 2
    concurrency: int = 8
    max_tokens: int = 64
    router_version: str = Router.version


def fleet_bench(opts: FleetBenchOptions, argv: list[str]) -> list[Path]:
    """Serve the two replicas and the two routers, run every round, write the result files,
    router-overhead.json and report.md; returns the result files."""
    if opts.rounds < 1:
        raise FleetError(f"fleet-bench: --rounds must be at least 1, got {opts.rounds}")
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    exe = ensure_router(opts.router_version, log=lambda m: print(f"fleet-bench: {m}", file=sys.stderr))
    files: list[Path] = []
    with contextlib.ExitStack() as stack:
        bases = [stack.enter_context(serving_process(opts.config, [], out / f"replica-{n}.log"))[1] for n in "ab"]
        fleets = {
            "router-1": _router(out, "router-1", "round_robin", bases[:1], opts.router_version),
            "router-2": _router(out, "router-2", "consistent_hash", bases, opts.router_version),
        }
        for name, fleet in fleets.items():
            proc = stack.enter_context(router_process(fleet, exe, out / f"{name}.log"))
            wait_healthy(fleet, proc, out / f"{name}.log", timeout=120)
        urls = {"direct-1": bases[0], **{n: f"http://127.0.0.1:{f.router.port}" for n, f in fleets.items()}}
        plan = [(v, 1) for v in VARIANTS[:2]] + [(v, opts.concurrency) for v in VARIANTS]
        for r in range(1, opts.rounds + 1):
            shift = (r - 1) % len(plan)  # each round starts elsewhere: warm-up and drift fall on every variant
            for v, c in plan[shift:] + plan[:shift]:
                metrics = [f"{b}/metrics" for b in (bases if v == "router-2" else bases[:1])]
                doc = run_benchmark(
                    BenchConfig(
                        base_url=f"{urls[v]}/v1",
                        sessions=opts.sessions,
                        turns_per_session=opts.turns,
                        concurrency=c,
                        max_tokens=opts.max_tokens,
                        label=v,
                        metrics_urls=metrics,
                        session_header=SESSION_HEADER,
                        recipe_config=str(opts.config),
                        warmup=8,
                        seed=r,
                        argv=["kimidflash", "fleet-bench", *argv],
                    )
                )
                doc.setdefault("notes", []).append(f"kimidflash fleet-bench variant {v} c={c} round {r}")
                files.append(write_result(out / f"{v}-c{c}-r{r}.json", doc))
                print(
                    f"fleet-bench: round {r} {v} c={c}: {doc['output_throughput']} output tok/s, median e2e "
                    f"{doc['median_e2el_ms']} ms",
                    file=sys.stderr,
                )
    write_overhead(files, out, opts, argv)
    compare([str(f) for f in files], baseline="direct-1", markdown=out / "report.md", terminal=False)
    return files


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


def write_overhead(files: list[Path], out: Path, opts: FleetBenchOptions, argv: list[str]) -> None:
    """Per round: the router's added latency one request at a time (router-1 minus
    direct-1, mean and median time from sent to last token) and the throughput
    ratios at --concurrency."""
    docs = {f.stem: read_json_object(f, "result file", FleetError) for f in files}
    c, rounds = opts.concurrency, []
    for r in range(1, opts.rounds + 1):
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
        "config": portable(opts.config),
        "settings": {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("config", "out")},
        "files": sorted(f.name for f in files),
        "rounds": rounds,
        "median": {k: statistics.median(x[k] for x in rounds) for k in rounds[0] if k != "round"},
    }
    write_text_atomic(out / "router-overhead.json", json.dumps(summary, indent=2) + "\n")
