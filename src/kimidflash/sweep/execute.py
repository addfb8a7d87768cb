"""Running a sweep: each server point through the recipe's serve path, each client
case through the benchmark tool, every result straight to the run folder.

A point fails alone: a server that will not start, dies, or a benchmark in
which a request failed is recorded (error and the server's last log lines)
and the sweep goes on with the next point. Ctrl-C or SIGTERM stops the
current server (the serve path's own clean stop) and leaves every finished
result in place; the same command resumes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..background import ServeError, serving_process
from ..bench.result import first_error, no_completion
from ..bench.resultfile import write_result
from ..bench.runner import BenchConfig, run_benchmark
from ..errors import BenchError, PointFailed
from ..logtail import Log
from .grid import Case, Plan, Point
from .predict import predict_ready
from .rundir import RunFolder, tail


@dataclass
class Served:
    base_url: str  # without /v1
    alive: Callable[[], bool]


# serve(base_config, sets, log_path, timeout) -> a context that yields the running server
ServeFn = Callable[[Path, list[str], Path, float], AbstractContextManager[Served]]


@contextlib.contextmanager
def serve_with_recipe(base_config: Path, sets: list[str], log_path: Path, timeout: float) -> Iterator[Served]:
    """`python -m kimidflash serve BASE --set ...`: validation, preparation,
    preflight, launcher, health wait and a clean SIGTERM stop, as users run it."""
    with serving_process(base_config, sets, log_path, timeout) as (proc, base):
        yield Served(base, lambda: proc.poll() is None)


def bench_config(plan: Plan, point: Point, case: Case, base_url: str, repeat: int) -> BenchConfig:
    b = plan.bench
    return BenchConfig(
        base_url=f"{base_url}/v1",
        sessions=case.sessions,
        turns_per_session=case.turns,
        concurrency=case.concurrency,
        max_tokens=case.max_tokens,
        temperature=b.temperature,
        warmup=b.warmup,
        seed=b.seed,
        prompts=None if case.prompts == "builtin" else case.prompts,
        timeout=b.timeout,
        label=point.label,
        recipe_config=str(plan.base_config),
        recipe_overrides=dict(point.overrides),
        ignore_eos=b.ignore_eos,
        workload=case.workload,
        progress=True,
        argv=["kimidflash", "sweep", f"point={point.id}", f"case={case.id}", f"repeat={repeat}"],
    )


def problem(doc: dict[str, Any]) -> str | None:
    """Why a benchmark result is not a measurement of the point, or None."""
    failure = no_completion(doc)
    if failure:
        return failure
    if doc.get("partial"):
        return f"the run stopped early: {doc.get('partial_reason')}"
    if doc.get("failed"):
        return f"{doc['failed']} of {doc.get('num_prompts')} requests failed: {first_error(doc) or '?'}"
    return None


def run_point(
    plan: Plan,
    folder: RunFolder,
    point: Point,
    todo: list[tuple[Case, int]],
    serve: ServeFn,
    say: Log,
) -> None:
    log = folder.log_path(point)
    log.parent.mkdir(parents=True, exist_ok=True)
    folder.event("point_start", point=point.id, overrides=point.sets, todo=[f"{c.id}-r{r}" for c, r in todo])
    say(f"sweep: serving {point.id} ({' '.join(point.sets)}); {len(todo)} benchmark run(s) to do")
    with serve(plan.base_config, point.sets, log, plan.start_timeout) as server:
        folder.event("server_ready", point=point.id)
        for case, repeat in todo:
            try:
                doc = run_benchmark(bench_config(plan, point, case, server.base_url, repeat))
            except BenchError as e:
                raise PointFailed(f"benchmark {case.id} repeat {repeat}: {e}") from None
            if not server.alive():
                raise PointFailed(f"the server exited during benchmark {case.id} repeat {repeat}")
            why = problem(doc)
            if why:
                raise PointFailed(f"benchmark {case.id} repeat {repeat}: {why}")
            doc.setdefault("notes", []).append(f"kimidflash sweep point {point.id}, case {case.id}, repeat {repeat}")
            write_result(folder.result_path(point, case, repeat), doc)
            folder.event(
                "result", point=point.id, case=case.id, repeat=repeat, output_throughput=doc.get("output_throughput")
            )
            say(f"sweep: {point.id} {case.id} r{repeat}: {doc.get('output_throughput')} output tok/s")


def run_sweep(plan: Plan, folder: RunFolder, serve: ServeFn | None = None, say: Log = print) -> list[str]:
    """Every point not yet complete, in plan order; the ids of the points that failed.
    `serve` defaults to the recipe's serve path (looked up here, so tests can swap it)."""
    serve = serve or serve_with_recipe
    failed: list[str] = []
    predict_ready(plan, folder)
    for point in plan.points:
        todo = folder.missing(point, plan.cases, plan.repeats)
        if not todo:
            continue
        try:
            run_point(plan, folder, point, todo, serve, say)
        except (ServeError, PointFailed) as e:
            first, *rest = str(e).splitlines() or ["?"]
            lines = tail(folder.log_path(point)) or rest[-30:]
            folder.record_failure(point, first, lines)
            say(f"sweep: point {point.id} FAILED: {first}; the sweep goes on")
            failed.append(point.id)
            continue
        folder.clear_failure(point)
        folder.event("point_done", point=point.id)
        predict_ready(plan, folder)
    return failed
