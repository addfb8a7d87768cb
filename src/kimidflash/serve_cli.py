"""`kimidflash serve`'s command line: its options parsed and checked, then `serve.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from .cliargs import add_config
from .config import load_config
from .paths import CONFIGS_DIR
from .serve import print_config, serve


def main(argv: list[str]) -> int:
    """`serve.sh` / `python -m kimidflash serve`."""
    p = argparse.ArgumentParser(
        prog="kimidflash serve", description="validate, preflight, start the server and wait until healthy"
    )
    add_config(p, default=str(CONFIGS_DIR / "production.env"), set_help="override one key (repeatable)")
    p.add_argument(
        "--dry-run", action="store_true", help="validate and print the command and environment; no host checks"
    )
    p.add_argument(
        "--preflight-only",
        action="store_true",
        help="run the host checks (devices, GPUs, NUMA, model dirs, shards, port) and exit 0 or 1; "
        "nothing is prepared or started",
    )
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="make what the runtime needs (the managed venv, the CPU configs' models, the image) and exit; "
        "nothing is started (a build step, or CI warming its caches)",
    )
    p.add_argument("--print-config", action="store_true", help="print every resolved value and where it came from")
    p.add_argument("--allow-numa-balancing", action="store_true", help="start even if NUMA balancing stays on")
    p.add_argument("--log-file", type=Path, help="also append the server log to this file")
    p.add_argument("--quiet", action="store_true", help="do not echo the server log")
    args = p.parse_args(argv)
    config = load_config(args.config, args.set, check_files=False)  # serve checks them
    if args.print_config:
        print_config(config)
        return 0
    return serve(
        config,
        dry_run=args.dry_run,
        preflight_only=args.preflight_only,
        prepare_only=args.prepare_only,
        allow_numa_balancing=args.allow_numa_balancing,
        log_path=args.log_file,
        quiet=args.quiet,
    )
