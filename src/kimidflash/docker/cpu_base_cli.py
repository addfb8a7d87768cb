"""`kimidflash cpu-base`'s command line: its options parsed and checked, then `cpu_base.py` called."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cpu_base import ensure_cpu_base
from .engine import ensure_engine


def main(argv: list[str] | None = None) -> int:
    """`python -m kimidflash cpu-base [--vllm-version V]`: build or find the CPU base; print its tag."""
    p = argparse.ArgumentParser(prog="kimidflash cpu-base", description=main.__doc__)
    p.add_argument("--vllm-version", default="0.32.0")
    p.add_argument("--ca-bundle", default=None, help="CA bundle for pip (default: the host's)")
    args = p.parse_args(argv)

    def log(m: str) -> None:
        print(f"kimidflash: {m}", file=sys.stderr)

    client = ensure_engine(log)
    tag = ensure_cpu_base(
        client, args.vllm_version, log=log, ca_bundle=Path(args.ca_bundle) if args.ca_bundle else True
    )
    print(tag)
    return 0
