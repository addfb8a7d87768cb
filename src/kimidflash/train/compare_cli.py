"""`kimidflash train-compare`'s command line: its options parsed and checked, then `compare.py` called."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cliargs import add_config, options
from . import compare as _domain
from .cli import guarded
from .compare import CompareOptions, compare


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="kimidflash train-compare", description=_domain.__doc__.splitlines()[0])
    add_config(p, set_help="an override for every variant")
    p.add_argument("--base-run", type=Path, required=True, help="a run folder whose setup and capture phases are done")
    p.add_argument("--seconds", type=float, required=True, help="wall-clock training budget per variant")
    p.add_argument("--out", type=Path, required=True, help="where NAME.json and summary.md go")
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        required=True,
        metavar=("NAME", "KEY=VALUE"),
        help="a variant: its name, then config overrides (repeatable)",
    )
    p.add_argument(
        "--eval-run",
        action="append",
        default=[],
        metavar="NAME=CONFIG",
        help="also score each variant on this evaluation-only run's records (repeatable)",
    )
    p.add_argument("--work", type=Path, help="the variants' run folders (default: the cache's train-compare/)")
    a = options(CompareOptions, p.parse_args(argv))
    return guarded(lambda: compare(a, argv), "rerun the same command: finished variants are kept")
