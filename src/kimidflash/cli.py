"""`python -m kimidflash <command>`: the one entry point the shell scripts call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import FIELDS, ConfigError, load_config, parse_overrides
from .paths import CONFIGS_DIR


def _print_config(config) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(config.path), show_lines=False)
    for col in ("key", "value", "from"):
        table.add_column(col, overflow="fold")
    for f in FIELDS:
        value = config[f.name]
        shown = "***" if f.secret and value else str(value)
        table.add_row(f.name, shown, config.sources[f.name])
    Console().print(table)


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    config = load_config(args.config, parse_overrides(args.set))
    if args.print_config:
        _print_config(config)
        return 0
    return serve(config, dry_run=args.dry_run, allow_numa_balancing=args.allow_numa_balancing,
                 log_path=args.log_file, quiet=args.quiet)


def cmd_config_docs(args: argparse.Namespace) -> int:
    from . import docs_gen

    if args.check:
        stale = docs_gen.stale()
        for p in stale:
            print(f"{p} disagrees with the schema, the patch set or the configs; run: python -m kimidflash config-docs", file=sys.stderr)
        return 1 if stale else 0
    for p in docs_gen.write():
        print(f"updated {p}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimidflash", description="Kimi K2.6 + DFlash serving recipe")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="validate, preflight, start the server and wait until healthy")
    s.add_argument("config", nargs="?", default=str(CONFIGS_DIR / "production.env"))
    s.add_argument("--dry-run", action="store_true", help="validate and print the command and environment; no host checks")
    s.add_argument("--print-config", action="store_true", help="print every resolved value and where it came from")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one key (repeatable)")
    s.add_argument("--allow-numa-balancing", action="store_true", help="start even if NUMA balancing stays on")
    s.add_argument("--log-file", type=Path, help="also append the server log to this file")
    s.add_argument("--quiet", action="store_true", help="do not echo the server log")
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("config-docs", help="regenerate the generated tables in README.md and docs/ (config reference, patch set, backend map)")
    d.add_argument("--check", action="store_true", help="exit 1 if a generated table disagrees with its source")
    d.set_defaults(func=cmd_config_docs)

    sub.add_parser("launch", help="the standard launcher (see launchers/kimi26-vllm-dflash.sh)", add_help=False)
    sub.add_parser("build", help="build the recipe image (same as build-kimi26-dflash.sh)", add_help=False)
    sub.add_parser("bench", help="the multi-turn benchmark (same as payload/benchmark_multi_turn.py)", add_help=False)
    sub.add_parser("validate-fp8", help="FP8 KV against BF16 KV: agreement, divergence, degenerate outputs (validate-fp8.sh)",
                   add_help=False)
    sub.add_parser("calibrate", help="measure FP8 KV scales, optionally write a checkpoint overlay "
                   "(same as payload/calibrate_kv_scales.py)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:  # its own argument syntax (`-- ARGV...`)
        from .launch import main as launch_main

        return launch_main(argv[1:])
    if argv[:1] == ["build"]:  # build-kimi26-dflash.sh
        from .docker.build import main as build_main

        return build_main(argv[1:])
    if argv[:1] == ["bench"]:  # payload/benchmark_multi_turn.py's CLI
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["validate-fp8"]:  # validate-fp8.sh; its own options and exit codes (0, 1, 2)
        from .fp8.validate import main as validate_main

        return validate_main(argv[1:])
    if argv[:1] == ["calibrate"]:  # payload/calibrate_kv_scales.py's CLI
        from .fp8.calibrate import main as calibrate_main

        return calibrate_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"kimidflash: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
