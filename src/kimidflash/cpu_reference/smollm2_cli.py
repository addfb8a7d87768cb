"""`kimidflash smollm2`'s command line: its options parsed and checked, then `smollm2.py` called.

Parsing lives here and the work in `smollm2.py`, so the work is importable and testable without
argparse, and a change of an option touches the command line alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import smollm2 as _domain
from .smollm2 import ensure


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kimidflash smollm2", description=_domain.__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", type=Path, default=None)
    a = p.parse_args(argv)
    print(ensure(a.out))
    return 0
