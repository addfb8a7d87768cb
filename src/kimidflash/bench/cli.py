"""Command line: `run` (the default, seed-compatible), `compare`, `validate`
and `export-prompts`, as one table of commands run by the package's dispatcher.

    benchmark_multi_turn.py --base-url URL/v1 --model NAME --sessions 32 \
        --turns-per-session 1 --max-tokens 512 [--output FILE.json]
    benchmark_multi_turn.py compare A.json B.json [--markdown OUT.md] [--charts DIR]
    benchmark_multi_turn.py validate FILE.json...
    benchmark_multi_turn.py export-prompts --sessions N [--seed S] [--warmup W] --output P.jsonl

The seed's form has no command name: options first means `run`. Also
`python -m kimidflash bench ...`.

Exit status: 0 done; 2 bad input or unusable server, an unwritable --output
included (one line naming the culprit, checked before the first request);
3 partial result (server died, counters reset) or no request completed (the
result is written with null figures, and one line names the first error);
130 interrupted (the partial result is still written).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ..commands import Command, dispatch
from ..config import ConfigError, load_config, parse_overrides
from ..errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    BenchError,
    ResultError,
)
from .prompts import export_jsonl
from .report import compare
from .result import no_completion
from .resultfile import check_output, load_json, validate_result, write_result
from .runner import Runner
from .series import PUBLISHED_SCHEMA, validate_published
from .settings import BenchConfig
from .terminal import print_summary
from .workloads import WORKLOADS

PROG = "benchmark_multi_turn.py"

COMMANDS = (
    Command(
        "run", "kimidflash.bench.cli:cmd_run", "one benchmark run (the default: options with no command name are run's)"
    ),
    Command("compare", "kimidflash.bench.cli:cmd_compare", "seed-style tables, Markdown and charts from result files"),
    Command("validate", "kimidflash.bench.cli:cmd_validate", "check result files against the schema"),
    Command(
        "export-prompts",
        "kimidflash.bench.cli:cmd_export",
        "write the prompts a run sends, as JSONL for vllm bench serve",
    ),
)


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Multi-turn streaming benchmark for an "
        "OpenAI-compatible server (vLLM), with spec-decode acceptance from /metrics. "
        "Other commands: " + ", ".join(f"'{PROG} {c.name} -h' ({c.help})" for c in COMMANDS if c.name != "run") + ".",
    )
    p.add_argument(
        "--base-url", help="the server's OpenAI root, e.g. http://127.0.0.1:8262/v1 (default: from --recipe-config)"
    )
    p.add_argument(
        "--model", help="served model name (default: the recipe's SERVED_MODEL_NAME, else the server's only model)"
    )
    p.add_argument("--sessions", type=int, default=32, help="concurrent conversations (default 32)")
    p.add_argument("--turns-per-session", type=int, default=1, help="user turns per session (default 1)")
    p.add_argument("--concurrency", type=int, default=None, help="max requests in flight (default: --sessions)")
    p.add_argument("--max-tokens", type=int, default=512, help="max output tokens per turn (default 512)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0, greedy)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before the window, excluded (default 2)")
    p.add_argument("--warmup-max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="prompt shuffling seed (default 0)")
    p.add_argument(
        "--prompts",
        default=None,
        metavar="builtin|FILE",
        help="prompt source: the built-in diverse set (default), a JSONL file or a ShareGPT JSON file",
    )
    p.add_argument("--kind", default=None, help="only the prompt source's conversations of this kind (category)")
    p.add_argument(
        "--workload",
        default="free",
        choices=list(WORKLOADS),
        help="what each request asks for: free text (default), json (response_format), tools "
        "(a named function tool; the server needs a tool-call parser) or envelope (a coding "
        "agent's JSON: a short header around one long content string)",
    )
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--think-time", type=float, default=0.0, help="seconds between a reply and the next turn")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds (default 600)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--label", default=None, help="series name in reports (e.g. 'dflash st=2')")
    p.add_argument("--output", "-o", default=None, metavar="FILE.json", help="write the result here (atomically)")
    p.add_argument(
        "--recipe-config",
        default=None,
        metavar="ENV_FILE",
        help="the recipe config that launched the server (recorded with its sha256)",
    )
    p.add_argument(
        "--recipe-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a --set the server was launched with (repeatable; recorded with the recipe config)",
    )
    role = p.add_mutually_exclusive_group()
    role.add_argument(
        "--speculative",
        dest="speculative",
        action="store_true",
        default=None,
        help="mark the run as speculative (default: from the recipe config or /metrics)",
    )
    role.add_argument(
        "--baseline", dest="speculative", action="store_false", help="mark the run as the autoregressive baseline"
    )
    p.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")
    p.add_argument(
        "--server-pid",
        type=int,
        default=None,
        metavar="PID",
        help="a server on this host (its launcher's pid): record the CPU time of it and every process "
        "under it in the window, per process (the result's server_cpu)",
    )
    p.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        dest="metrics_urls",
        help="default: <server root>/metrics; repeat for each server behind a router (the fleet is "
        "read as one, with each server's share)",
    )
    p.add_argument(
        "--session-header",
        default=None,
        metavar="NAME",
        help="send each session's id in this header (X-Session-ID: what vllm-router's consistent_hash keys on)",
    )
    p.add_argument(
        "--no-vllm-extensions",
        action="store_true",
        help="do not send return_token_ids / continuous_usage_stats (non-vLLM servers)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to always generate --max-tokens")
    p.add_argument(
        "--max-connection-errors",
        type=int,
        default=3,
        help="stop (partial result) after this many connection failures in a row",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary table")
    return p


def _compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} compare",
        description="Seed-style tables and charts from result "
        "files (ours, or the seed's published figures in benchmarks/seed/).",
    )
    p.add_argument("files", nargs="+", help="result JSON files")
    p.add_argument("--baseline", default=None, help="label of the baseline series (default: the non-speculative one)")
    p.add_argument("--markdown", default=None, metavar="OUT.md", help="write the tables as Markdown")
    p.add_argument("--charts", default=None, metavar="DIR", help="draw PNG charts into DIR")
    p.add_argument("--quiet", "-q", action="store_true", help="no terminal tables")
    return p


def _validate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} validate", description="Check result files against the schema.")
    p.add_argument("files", nargs="+")
    return p


def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} export-prompts",
        description="Write the first turns a run with "
        'these settings sends, as JSONL {"prompt": ...} (for vllm bench serve\'s custom dataset).',
    )
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", default=None, metavar="builtin|FILE")
    p.add_argument("--output", "-o", required=True)
    return p


def _err(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)


def config_from_args(a: argparse.Namespace, argv: Sequence[str]) -> BenchConfig:
    try:
        overrides = parse_overrides(a.recipe_set)
    except ConfigError as e:
        raise BenchError(f"--recipe-set: {e}") from None
    if overrides and not a.recipe_config:
        raise BenchError("--recipe-set needs --recipe-config")
    base_url = a.base_url
    if base_url is None:
        if not a.recipe_config:
            raise BenchError("--base-url is required (or --recipe-config to take it from the recipe)")
        try:
            base_url = load_config(a.recipe_config, overrides or None).base_url + "/v1"
        except FileNotFoundError:
            raise BenchError(f"recipe config not found: {a.recipe_config}") from None
        except Exception as e:  # noqa: BLE001 - the loader's message names key and file
            raise BenchError(f"recipe config {a.recipe_config}: {e}") from None
    return BenchConfig(
        base_url=base_url,
        model=a.model,
        sessions=a.sessions,
        turns_per_session=a.turns_per_session,
        concurrency=a.concurrency,
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        warmup=a.warmup,
        warmup_max_tokens=a.warmup_max_tokens,
        seed=a.seed,
        prompts=a.prompts,
        kind=a.kind,
        workload=a.workload,
        system_prompt=a.system_prompt,
        think_time=a.think_time,
        timeout=a.timeout,
        api_key=a.api_key,
        label=a.label,
        scrape_metrics=not a.no_metrics,
        metrics_urls=a.metrics_urls,
        session_header=a.session_header,
        vllm_extensions=not a.no_vllm_extensions,
        ignore_eos=a.ignore_eos,
        recipe_config=a.recipe_config,
        recipe_overrides=overrides or None,
        speculative=a.speculative,
        server_pid=a.server_pid,
        max_connection_errors=a.max_connection_errors,
        progress=not a.no_progress and sys.stderr.isatty(),
        handle_signals=True,
        argv=[PROG, *argv],
    )


def cmd_run(argv: Sequence[str]) -> int:
    """One run: exit 0, 2 (bad input, nothing written), 3 (partial) or 130 (interrupted, partial written)."""
    a = _run_parser().parse_args(argv)
    cfg = config_from_args(a, argv)
    runner = Runner(cfg)
    if a.output:
        check_output(a.output)  # before the first request, not after the whole run
    try:
        doc = asyncio.run(runner.run())
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the handlers were installed
        _err("interrupted; no result written (a single Ctrl-C during a run writes a partial result)")
        raise
    if a.output:
        try:
            write_result(a.output, doc)
        except OSError as e:
            raise BenchError(f"cannot write {a.output}: {e}") from None
    if not a.quiet:
        print_summary(doc)
    if a.output:
        print(f"result: {a.output}{' (partial)' if doc['partial'] else ''}", file=sys.stderr)
    elif not a.quiet:
        print("(no --output: result not saved)", file=sys.stderr)
    if runner.st.interrupted:
        return EXIT_INTERRUPTED
    failure = no_completion(doc)
    if failure:
        _err(failure)
        return EXIT_PARTIAL
    return EXIT_PARTIAL if doc["partial"] else EXIT_OK


def cmd_compare(argv: Sequence[str]) -> int:
    """Tables (and optionally Markdown and charts) from result files."""
    a = _compare_parser().parse_args(argv)
    compare(a.files, baseline=a.baseline, markdown=a.markdown, charts=a.charts, terminal=not a.quiet)
    return EXIT_OK


def cmd_validate(argv: Sequence[str]) -> int:
    """Every file checked, each problem one line; exit 2 when any file is bad."""
    a = _validate_parser().parse_args(argv)
    bad = 0
    for f in a.files:
        try:
            doc = load_json(f)
        except ResultError as e:
            _err(str(e))
            bad += 1
            continue
        problems = validate_published(doc) if doc.get("schema") == PUBLISHED_SCHEMA else validate_result(doc)
        if problems:
            bad += 1
            for p in problems:
                _err(f"{f}: {p}")
        else:
            marks = [
                m for m, on in (("partial", doc.get("partial")), ("no request completed", no_completion(doc))) if on
            ]
            print(f"{f}: valid{' (' + ', '.join(marks) + ')' if marks else ''}")
    if bad:
        raise ResultError(f"{bad} of {len(a.files)} files are not valid results (named above)")
    return EXIT_OK


def cmd_export(argv: Sequence[str]) -> int:
    """The prompts a run would send, for `vllm bench serve`'s custom dataset."""
    a = _export_parser().parse_args(argv)
    check_output(a.output)
    n = export_jsonl(a.output, a.sessions, a.seed, a.warmup, a.prompts)
    print(f"{a.output}: {n} prompts", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(
        COMMANDS,
        sys.argv[1:] if argv is None else argv,
        prog=PROG,
        default="run",
        description="Multi-turn streaming benchmark for an OpenAI-compatible server (vLLM) and its "
        f"result tools. Options with no command run a benchmark ('{PROG} run -h').",
    )
