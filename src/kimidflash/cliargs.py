"""Command-line arguments several commands share, declared once (a leaf module).

`CONFIG` is the env file (or training config) a command reads, and `--set KEY=VALUE`
is how every such command overrides one key; `load_config` takes the list it collects
as it is.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

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


def options(cls: type[T], args: argparse.Namespace) -> T:
    """The typed options value `cls` (a dataclass) from a parsed command line: each field takes
    the argument of its name, so a command's domain code reads attributes the type checker knows."""
    assert dataclasses.is_dataclass(cls)
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
