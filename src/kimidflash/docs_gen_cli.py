"""`kimidflash config-docs`'s command line: its options parsed and checked, then `docs_gen.py` called."""

from __future__ import annotations

import argparse
import sys

from .docs_gen import stale, write


def main(argv: list[str]) -> int:
    """`python -m kimidflash config-docs [--check]`."""
    p = argparse.ArgumentParser(
        prog="kimidflash config-docs",
        description="regenerate the generated tables in "
        "README.md and docs/ (config reference, patch set, backend map, production commands)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a generated table disagrees with its source")
    if p.parse_args(argv).check:
        out_of_date = stale()
        for path in out_of_date:
            print(
                f"{path} disagrees with the schema, the patch set or the configs; "
                "run: python -m kimidflash config-docs",
                file=sys.stderr,
            )
        return 1 if out_of_date else 0
    for path in write():
        print(f"updated {path}")
    return 0
