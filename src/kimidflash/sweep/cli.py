"""`python -m kimidflash sweep` (launchers/kimi26-vllm-dflash-sweep.sh): serve every
point of a grid through the recipe, benchmark each client case, summarise, pick.

    kimidflash sweep configs/cpu-reference.env --grid NUM_SPECULATIVE_TOKENS=1,2,3,5,7 \\
        --concurrency 1 4 8 --repeats 3 --out sweeps/cpu-reference

Re-running the same command resumes; `--dry-run` lists the points and commands.
Exit 0 when every point was measured, 1 when a point failed (the rest are
measured and summarised), 2 on bad input, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import __version__
from ..backends import patchset_hash
from ..background import sigterm_as_interrupt
from ..bench.provenance import host_info
from ..bench.workloads import NO_IGNORE_EOS, WORKLOADS
from ..cliargs import add_config
from ..config import Config, load_config
from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, SweepError
from ..fsio import git_info, utc_now
from ..paths import REPO_ROOT, portable, portable_argv
from ..render import render
from .execute import run_sweep
from .grid import BenchOptions, Case, Grid, Plan, add_client, add_server, cases, points, read_grid_file
from .report import write_summary
from .rundir import RunFolder
from .summary import Limits


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimidflash sweep", description=__doc__.splitlines()[0])
    add_config(p, "the base env file every point overrides", type=Path, set_help=None)
    p.add_argument("--grid-file", type=Path, help="a TOML file with [server] keys and [client] settings")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a server key and its values (any env-file key; repeatable)",
    )
    p.add_argument("--concurrency", type=int, nargs="+", help="max requests in flight (default 1 8)")
    p.add_argument("--sessions", type=int, nargs="+", help="conversations per run (default 16)")
    p.add_argument("--turns", type=int, nargs="+", help="user turns per session (default 1)")
    p.add_argument("--max-tokens", type=int, nargs="+", help="max output tokens per turn (default 128)")
    p.add_argument("--prompts", nargs="+", metavar="builtin|FILE", help="prompt sets (default builtin)")
    p.add_argument(
        "--workload",
        nargs="+",
        help="request workloads: free (default), json, tools, envelope (kimidflash bench --help)",
    )
    p.add_argument("--repeats", type=int, default=3, help="benchmark runs per point and case (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before each run (default 2)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens")
    p.add_argument("--request-timeout", type=float, default=600.0, help="per-request limit in seconds")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=3600.0,
        help="seconds for one server to prepare and become ready (default 3600)",
    )
    p.add_argument("--max-p95-latency", type=float, metavar="S", help="best point: p95 request latency at most S s")
    p.add_argument("--min-user-tps", type=float, metavar="X", help="best point: at least X output tok/s per user")
    p.add_argument("--out", type=Path, required=True, help="the run folder (resumed when it holds this sweep)")
    p.add_argument("--new", action="store_true", help="the folder holds another sweep: move it aside and start")
    p.add_argument("--dry-run", action="store_true", help="list the points and commands; run nothing")
    return p


def build_plan(a: argparse.Namespace) -> tuple[Plan, Grid]:
    if a.repeats < 1:
        raise SweepError(f"--repeats must be at least 1, got {a.repeats}")
    for name in ("max_p95_latency", "min_user_tps"):
        v = getattr(a, name)
        if v is not None and not v > 0:
            raise SweepError(f"--{name.replace('_', '-')} must be positive, got {v}")
    grid = read_grid_file(a.grid_file) if a.grid_file else Grid()
    for item in a.grid:
        key, sep, vals = item.partition("=")
        if not sep or not key:  # KEY= is one empty value: the key unset, as in an env file
            raise SweepError(f"--grid {item!r}: expected KEY=V1,V2,...")
        add_server(grid, key.strip(), [v.strip() for v in vals.split(",")], "--grid")
    for key in ("concurrency", "sessions", "turns", "max_tokens", "prompts", "workload"):
        if getattr(a, key):
            add_client(grid, key, getattr(a, key), f"--{key.replace('_', '-')}")
    for flag, value, ok in (
        ("--warmup", a.warmup, a.warmup >= 0),
        ("--temperature", a.temperature, a.temperature >= 0),
        ("--request-timeout", a.request_timeout, a.request_timeout > 0),
        ("--start-timeout", a.start_timeout, a.start_timeout > 0),
    ):
        if not ok:
            raise SweepError(f"{flag} {value}: must be {'positive' if 'timeout' in flag else '0 or more'}")
    structured = [w for w in grid.client.get("workload", []) if WORKLOADS[w].structured]
    if a.ignore_eos and structured:
        raise SweepError(f"--ignore-eos with the {', '.join(structured)} workload: {NO_IGNORE_EOS}")
    bench = BenchOptions(
        warmup=a.warmup, temperature=a.temperature, seed=a.seed, ignore_eos=a.ignore_eos, timeout=a.request_timeout
    )
    config = a.config.resolve()
    return Plan(config, points(grid, config), cases(grid), a.repeats, bench, a.start_timeout), grid


def identity(plan: Plan, grid: Grid, base: Config) -> dict[str, Any]:
    """What a run folder answers to; --repeats is not part of it (more repeats extend a sweep)."""
    return {
        "base_config": portable(plan.base_config),
        "base_config_sha256": base.digest(),
        "grid": grid.as_dict(),
        "points": {p.id: p.sets for p in plan.points},
        "cases": [_case_identity(c) for c in plan.cases],
        "bench": asdict(plan.bench),
    }


def _case_identity(c: Case) -> dict[str, Any]:
    """A case as a run folder records it; free text (the default workload) is left out, so folders
    written before workloads existed still resume."""
    d = {**asdict(c), "prompts": portable(c.prompts)}
    if d["workload"] == "free":
        del d["workload"]
    return d


def dry_run(plan: Plan) -> None:
    base = shlex.quote(portable(plan.base_config))
    print(f"# {len(plan.points)} server points x {len(plan.cases)} client cases x {plan.repeats} repeats")
    for p in plan.points:
        cfg = load_config(plan.base_config, dict(p.overrides))
        role = "baseline" if p.is_baseline else f"vs {p.baseline_id}"
        print(f"\n[{p.id}] {p.label} ({role})")
        print("  serve: python -m kimidflash serve " + " ".join([base, *(f"--set {shlex.quote(s)}" for s in p.sets)]))
        print("  vllm:  " + shlex.join(render(cfg).argv))
    for c in plan.cases:
        print(
            f"\n[{c.id}] bench run --concurrency {c.concurrency} --sessions {c.sessions} --turns-per-session "
            f"{c.turns} --max-tokens {c.max_tokens} --prompts {portable(c.prompts)} --warmup {plan.bench.warmup} "
            f"--temperature {plan.bench.temperature:g} --seed {plan.bench.seed}"
            f"{' --ignore-eos' if plan.bench.ignore_eos else ''}"
            f"{f' --workload {c.workload}' if c.workload != 'free' else ''}  (x{plan.repeats})"
        )


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    plan, grid = build_plan(a)
    if a.dry_run:
        dry_run(plan)
        return EXIT_OK
    console = Console(stderr=True)
    folder = RunFolder(a.out)
    base = load_config(plan.base_config)
    context = {
        "created": utc_now(),
        "tool_version": __version__,
        "git": git_info(REPO_ROOT),
        "host": host_info(),
        "vllm_version_pin": base.vllm_version,
        "vllm_patch_set": patchset_hash(),
        "command": " ".join(portable_argv(["kimidflash", "sweep", *argv])),
    }
    resumed = folder.open(identity(plan, grid, base), context, new=a.new)
    folder.event("sweep_start", resumed=resumed, repeats=plan.repeats, command=context["command"])
    limits = Limits(a.max_p95_latency, a.min_user_tps)
    try:
        with sigterm_as_interrupt():
            failed = run_sweep(
                plan, folder, say=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True)
            )
    except KeyboardInterrupt:
        folder.event("interrupted")
        write_summary(plan, folder, limits)
        console.print(
            f"sweep: interrupted; finished results are kept in {a.out}. Re-run the same command to resume.",
            markup=False,
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED
    summary = write_summary(plan, folder, limits, console)
    folder.event("sweep_done", failed=failed)
    if summary["best"] is not None and summary.get("schedule"):
        print(
            f"best: the draft schedule {summary['schedule']['schedule']}, written to {a.out / 'best.env'} (the best "
            f"static point, {summary['best']['point']} at {summary['best']['case']}, to best-static.env):"
        )
        print((a.out / "best.env").read_text(), end="")
    elif summary["best"] is not None:
        print(f"best: {summary['best']['point']} at {summary['best']['case']}, written to {a.out / 'best.env'}:")
        print((a.out / "best.env").read_text(), end="")
    else:
        print(f"best: no point meets the limits ({limits.describe()})")
    return EXIT_FAILED if failed else EXIT_OK
