"""`kimidflash fleet-bench`'s command line: its options parsed, then `bench.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cliargs import add_config, options
from . import bench as _domain
from .bench import FleetBenchOptions, fleet_bench
from .spec import Router


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
    fleet_bench(options(FleetBenchOptions, p.parse_args(argv)), argv)
    return 0
