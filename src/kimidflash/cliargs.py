"""Command-line arguments several commands share, declared once (a leaf module).

`--set KEY=VALUE` is how every command that reads an env file (or a training
config) overrides one key; `load_config` takes the list it collects as it is.
"""

from __future__ import annotations

import argparse

SET_HELP = "override one key of the config (repeatable)"


def add_set(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """`--set KEY=VALUE`, repeatable, collected into a list (empty when not given)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)
