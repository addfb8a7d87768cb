"""Where a served step's time goes: py-spy samples of the vLLM worker under load, per variant.

A throughput ratio says that a variant costs; a profile says what. `kimidflash
profile` serves each variant in turn, drives it with the benchmark client, and
records the process that runs the model (`VLLM::Worker`, else the engine core)
with py-spy for the whole run; `--process engine-core` records the engine core
instead, whose scheduling and output handling run serially with each step.
Each function's inclusive share of the samples goes to profile.json and
profile.md, and the collapsed stacks to
`<label>-stacks.txt` for a flame graph. The share of a function that only one
variant runs (a drafter's context store under a k=0 draft schedule) is what that
variant pays for it. py-spy slows what it samples, so the throughput beside a
profile is not a speed figure: `kimidflash ab` measures those.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..background import serving_process
from ..config import parse_overrides
from ..errors import BenchError
from ..fsio import write_json_atomic, write_text_atomic
from ..paths import portable
from .markdown import to_markdown
from .provenance import local_provenance
from .resultfile import write_result
from .runner import BenchConfig, run_benchmark
from .tables import Table

MODEL_PROCESSES = ("VLLM::Worker", "VLLM::EngineCore")  # the first one found is recorded
PROCESSES = {  # --process: the titles looked for, in order, and what the report calls the one found
    "model": (MODEL_PROCESSES, "worker"),
    "engine-core": (("VLLM::EngineCore",), "engine core"),
}
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
NO_STACK = "(no Python stack)"  # py-spy's empty-stack samples, kept so every share has the same total
SHOWN = 0.01  # profile.md lists the functions with at least this share in some variant


def frame_key(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (path/to/file.py)', the path cut below site-packages so
    no machine's prefix is kept."""
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = re.sub(r"^.*/(site|dist)-packages/", "", m["file"])
    if path.startswith("/"):
        path = "/".join(path.split("/")[-2:])
    return f"{m['func']} ({path})"


def read_collapsed(text: str) -> Counter[tuple[str, ...]]:
    """py-spy's raw output ('frame;frame;... COUNT' per line) -> stack -> samples; the 'process ...'
    frames that --subprocesses adds are dropped, and a sample with no frames counts as NO_STACK.

    A line that does not end in a count goes on in the next one: --nonblocking reads the process
    without pausing it, and a frame read while it changed can hold a newline (seen on a loaded
    2-core machine: a frame ending in source text, the next line `from . import activation`). The
    sample still counts; output that ends without a count is refused, naming its first line."""
    stacks: Counter[tuple[str, ...]] = Counter()
    pending, first = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not pending:
            if not line.strip():
                continue
            first = n
        pending = f"{pending}\n{line}" if pending else line
        stack, sep, count = pending.rpartition(" ")
        if not sep or not count.isdigit():
            continue
        frames = tuple(frame_key(f) for f in stack.split(";") if f.strip() and not f.startswith("process "))
        stacks[frames or (NO_STACK,)] += int(count)
        pending = ""
    if pending:
        raise BenchError(f"py-spy output line {first} is not 'STACK COUNT': {pending[:80]!r}")
    return stacks


def shares(stacks: Counter[tuple[str, ...]]) -> dict[str, float]:
    """Function -> share of all samples in which it is on the stack (inclusive, once per sample)."""
    total = sum(stacks.values())
    if not total:
        raise BenchError("py-spy recorded no samples")
    inclusive: Counter[str] = Counter()
    for frames, count in stacks.items():
        for f in set(frames):
            inclusive[f] += count
    return {f: round(c / total, 4) for f, c in inclusive.most_common()}


def table(variants: list[dict[str, Any]], floor: float = SHOWN) -> list[list[str]]:
    """Rows of profile.md: each function over `floor` in some variant, its share per variant and,
    for every later variant, the change from the first, largest change first."""
    first = variants[0]["shares"]
    names = {f for v in variants for f, s in v["shares"].items() if s >= floor}

    def change(f: str) -> float:
        return max((abs(v["shares"].get(f, 0.0) - first.get(f, 0.0)) for v in variants[1:]), default=0.0)

    rows = []
    for f in sorted(names, key=lambda f: (-change(f), -first.get(f, 0.0), f)):
        cells = [f"{v['shares'].get(f, 0.0) * 100:.1f}%" for v in variants]
        cells += [f"{(v['shares'].get(f, 0.0) - first.get(f, 0.0)) * 100:+.1f}" for v in variants[1:]]
        rows.append([f, *cells])
    return rows


def model_process(serve_pid: int, titles: tuple[str, ...] = MODEL_PROCESSES) -> tuple[int, str]:
    """(pid, title) of the serve process's descendant with the first of these titles found."""
    procs = psutil.Process(serve_pid).children(recursive=True)
    for title in titles:
        for p in procs:
            try:
                if title in " ".join(p.cmdline()):
                    return p.pid, title
            except psutil.Error:
                continue
    raise BenchError(f"no {' or '.join(titles)} process under serve (pid {serve_pid})")


def py_spy() -> str:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not found:
        raise BenchError("py-spy not found: pip install py-spy (the project's test extra has it)")
    return found


@dataclass(frozen=True)
class ProfileOptions:
    """What one `kimidflash profile` run is asked to do (the defaults are the command line's)."""

    serve_config: Path
    out: str
    set: list[str] = field(default_factory=list)  # KEY=VALUE, given to every variant
    prompts: str | None = None  # None: the built-in set
    concurrency: int = 8
    sessions: int = 32
    max_tokens: int = 64
    warmup: int = 2
    rate: int = 100  # py-spy samples per second
    process: str = "model"  # a key of PROCESSES


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """'LABEL' or 'LABEL:KEY=VALUE,KEY=VALUE' -> (label, overrides)."""
    label, _, sets = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label):
        raise BenchError(f"--variant {spec!r}: the label must be letters, digits, '.', '_' or '-'")
    overrides = [s for s in sets.split(",") if s]
    parse_overrides(overrides)  # a malformed KEY=VALUE is named here, before any server starts
    return label, overrides


def profile_variant(a: ProfileOptions, label: str, sets: list[str], out: Path) -> dict[str, Any]:
    """Serve one variant, benchmark it under py-spy, and return its record for profile.json."""
    raw = out / f".{label}.pyspy.part"
    with serving_process(a.serve_config, [*a.set, *sets], out / f"{label}-server.log") as (proc, base):
        pid, title = model_process(proc.pid, PROCESSES[a.process][0])
        spy = subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(a.rate),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--nonblocking",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            doc = run_benchmark(
                BenchConfig(
                    base_url=f"{base}/v1",
                    sessions=a.sessions,
                    concurrency=a.concurrency,
                    max_tokens=a.max_tokens,
                    prompts=a.prompts,
                    warmup=a.warmup,
                    label=label,
                    recipe_config=str(a.serve_config),
                    recipe_overrides=parse_overrides([*a.set, *sets]),
                    server_pid=proc.pid,
                )
            )
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
            log, _ = spy.communicate(timeout=120)
    if not raw.is_file():
        raise BenchError(f"py-spy wrote nothing for {label} ({title}, pid {pid}): {log.strip()[-500:]}")
    try:
        stacks = read_collapsed(raw.read_text())
    finally:
        raw.unlink()  # a partial file, never a result
    write_text_atomic(
        out / f"{label}-stacks.txt", "".join(f"{';'.join(frames)} {n}\n" for frames, n in stacks.most_common())
    )
    doc.setdefault("notes", []).append(
        f"kimidflash profile variant '{label}': measured under py-spy at {a.rate} Hz, not a speed figure"
    )
    write_result(out / f"{label}-c{a.concurrency}.json", doc)
    return {
        "label": label,
        "overrides": sets,
        "process": title,
        "samples": sum(stacks.values()),
        "output_tps_under_profiler": doc.get("output_throughput"),
        "shares": shares(stacks),
    }


def write_report(doc: dict[str, Any], out: Path) -> str:
    variants = doc["variants"]
    first = variants[0]["label"]
    shares_t = Table(
        "Inclusive share of the samples, in percent",
        ["function", *(v["label"] for v in variants), *(f"{v['label']} - {first}" for v in variants[1:])],
        table(variants),
        right=set(range(1, 2 * len(variants))),
    )
    runs = Table(
        "Variants",
        ["variant", "overrides", "process", "samples", "output tok/s under the profiler"],
        [
            [
                v["label"],
                " ".join(v["overrides"]) or "(the config as it is)",
                v["process"],
                str(v["samples"]),
                str(v["output_tps_under_profiler"]),
            ]
            for v in variants
        ],
        right={3, 4},
    )
    text = "\n".join(
        [
            f"# Where the {PROCESSES[doc.get('process', 'model')][1]}'s time goes at {doc['concurrency']} users",
            "",
            "Written by `kimidflash profile`: py-spy samples of one server process (the table of variants names "
            "it), over the whole benchmark run of each variant. A function's share counts every sample in which it "
            "is on the stack. "
            f"Functions at {SHOWN:.0%} or more in some variant are listed, largest change first; `profile.json` "
            "holds them all, with the provenance.",
            "",
            to_markdown(shares_t),
            to_markdown(runs),
        ]
    )
    write_text_atomic(out / "profile.md", text)
    return text


def run(a: ProfileOptions, specs: Iterable[tuple[str, list[str]]]) -> dict[str, Any]:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [profile_variant(a, label, sets, out) for label, sets in specs]
    doc = {
        "provenance": local_provenance(),
        "config": portable(a.serve_config),
        "overrides": a.set,
        "process": a.process,
        "concurrency": a.concurrency,
        "sessions": a.sessions,
        "max_tokens": a.max_tokens,
        "rate_hz": a.rate,
        "variants": variants,
    }
    write_json_atomic(out / "profile.json", doc)
    return doc
