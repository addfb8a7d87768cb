"""`kimidflash docker-engine`'s command line: its options parsed and checked, then `engine.py` called."""

from __future__ import annotations

import argparse

from .engine import describe, ensure_engine, require_client


def main(argv: list[str] | None = None) -> int:
    """`python -m kimidflash docker-engine [--ensure]`: print the engine in use (exit 2 if none)."""
    p = argparse.ArgumentParser(prog="kimidflash docker-engine", description=main.__doc__)
    p.add_argument(
        "--ensure", action="store_true", help="install docker.io and start a private dockerd if none answers"
    )
    args = p.parse_args(argv)
    client = ensure_engine() if args.ensure else require_client()
    engine = describe(client)
    print(f"{engine.base_url} (Docker {engine.server_version}, API {engine.api_version})")
    return 0
