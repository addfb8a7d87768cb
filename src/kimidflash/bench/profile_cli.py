"""`kimidflash profile`'s command line: its options parsed and checked, then `profile.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..background import sigterm_as_interrupt
from ..cliargs import add_set, options
from ..config import parse_overrides
from ..errors import BenchError
from . import profile as _domain
from .profile import PROCESSES, ProfileOptions, parse_variant, py_spy, run, write_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kimidflash profile", description=_domain.__doc__.splitlines()[0])
    p.add_argument("serve_config", type=Path)
    p.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="LABEL[:KEY=VALUE,...]",
        help="a variant to serve and profile, the config with these overrides (repeatable; the "
        "first is what profile.md compares the others with)",
    )
    add_set(p, "override for every variant")
    p.add_argument("--prompts", default=None, help="builtin (default), a JSONL or a ShareGPT file")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument(
        "--process",
        choices=sorted(PROCESSES),
        default="model",
        help="what py-spy samples: the process that runs the model (the worker; default) or the "
        "engine core (scheduling and output handling, serial with each step)",
    )
    p.add_argument("--out", required=True, help="folder for profile.json, profile.md and the stacks")
    a = p.parse_args(argv)
    specs = [parse_variant(v) for v in a.variant]
    if len({label for label, _ in specs}) != len(specs):
        raise BenchError("--variant labels must differ")
    parse_overrides(a.set)
    py_spy()  # before any server starts
    with sigterm_as_interrupt():
        doc = run(options(ProfileOptions, a), specs)
    print(write_report(doc, Path(a.out)))
    return 0
