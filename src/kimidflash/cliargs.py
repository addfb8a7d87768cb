"""Command-line arguments several commands share, declared once (a leaf module).

`CONFIG` is the env file (or training config) a command reads, and `--set KEY=VALUE`
is how every such command overrides one key; `load_config` takes the list it collects
as it is.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

SET_HELP = "override one key of the config (repeatable)"


def add_set(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """`--set KEY=VALUE`, repeatable, collected into a list (empty when not given)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_config(
    parser: argparse.ArgumentParser,
    help: str | None = None,
    default: str | None = None,
    type: Callable[[str], Any] = str,
    set_help: str | None = SET_HELP,
) -> None:
    """The positional `config` (optional when it has a `default`), and `--set` beside it unless
    `set_help` is None (a command that reads its config as it is)."""
    if default is None:
        parser.add_argument("config", type=type, help=help)
    else:
        parser.add_argument("config", nargs="?", type=type, default=default, help=help or f"default: {default}")
    if set_help is not None:
        add_set(parser, set_help)
