"""`kimidflash fleet-bench`'s command line: its options parsed and checked, then `bench.py` called."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..background import serving_process
from ..bench.report import compare
from ..bench.resultfile import write_result
from ..bench.runner import BenchConfig, run_benchmark
from ..cliargs import add_config
from . import bench as _domain
from .bench import VARIANTS, _router, write_overhead
from .router import SESSION_HEADER
from .run import router_process, wait_healthy
from .spec import Router
from .venv import ensure_router


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash fleet-bench", description=_domain.__doc__.split("\n\n")[0])
    add_config(p, "the recipe config both replicas serve", set_help=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--router-version", default=Router.version)
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("fleet-bench: --rounds must be at least 1")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    exe = ensure_router(args.router_version, log=lambda m: print(f"fleet-bench: {m}", file=sys.stderr))
    files: list[Path] = []
    with contextlib.ExitStack() as stack:
        bases = [stack.enter_context(serving_process(args.config, [], out / f"replica-{n}.log"))[1] for n in "ab"]
        fleets = {
            "router-1": _router(out, "router-1", "round_robin", bases[:1], args.router_version),
            "router-2": _router(out, "router-2", "consistent_hash", bases, args.router_version),
        }
        for name, fleet in fleets.items():
            proc = stack.enter_context(router_process(fleet, exe, out / f"{name}.log"))
            wait_healthy(fleet, proc, out / f"{name}.log", timeout=120)
        urls = {"direct-1": bases[0], **{n: f"http://127.0.0.1:{f.router.port}" for n, f in fleets.items()}}
        plan = [(v, 1) for v in VARIANTS[:2]] + [(v, args.concurrency) for v in VARIANTS]
        for r in range(1, args.rounds + 1):
            shift = (r - 1) % len(plan)  # each round starts elsewhere: warm-up and drift fall on every variant
            for v, c in plan[shift:] + plan[:shift]:
                metrics = [f"{b}/metrics" for b in (bases if v == "router-2" else bases[:1])]
                doc = run_benchmark(
                    BenchConfig(
                        base_url=f"{urls[v]}/v1",
                        sessions=args.sessions,
                        turns_per_session=args.turns,
                        concurrency=c,
                        max_tokens=args.max_tokens,
                        label=v,
                        metrics_urls=metrics,
                        session_header=SESSION_HEADER,
                        recipe_config=str(args.config),
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
    write_overhead(files, out, args, argv)
    compare([str(f) for f in files], baseline="direct-1", markdown=out / "report.md", terminal=False)
    return 0
