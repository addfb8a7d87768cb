"""The one dispatcher: a table of named commands, each run with its own argv.

Every command is a ``main(argv) -> int`` named by ``"module:function"`` and
imported only when chosen, so `serve` never pays for torch and `train` never
needs the docker SDK. The dispatcher gives every table the same behaviour:
``--help`` lists the commands, a mistyped name gets a suggestion, a
:class:`~kimidflash.errors.RecipeError` becomes one line and exit 2, a
:class:`~kimidflash.errors.RunFailed` one line and exit 1 (``errors.EXIT_STATUS``
has the rest), Ctrl-C exit 130: the one place an error becomes an exit status
(the tree is drawn in ``errors.py``).
Tables may default to one command (the seed's benchmark script takes options
with no command name).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, KimidflashError, exit_status


@dataclass(frozen=True)
class Command:
    name: str
    target: str  # "package.module:function", the function taking argv and returning the exit status
    help: str

    def load(self) -> Callable[[list[str]], int]:
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


def usage(commands: Sequence[Command], prog: str, description: str) -> str:
    width = max(len(c.name) for c in commands)
    lines = [
        f"usage: {prog} COMMAND [ARGS...]   ({prog} COMMAND --help for its options)",
        "",
        description,
        "",
        "commands:",
    ]
    lines += [f"  {c.name:<{width}}  {c.help}" for c in commands]
    return "\n".join(lines)


def dispatch(
    commands: Sequence[Command], argv: Sequence[str], *, prog: str, description: str, default: str | None = None
) -> int:
    """Run the command ``argv`` names (or ``default`` when ``argv`` starts with an option). With a
    default, ``--help`` is the default command's own: its options are what a user of the bare form
    (the seed's benchmark command line) looks for, and its description names the other commands."""
    argv = list(argv)
    table = {c.name: c for c in commands}
    if argv[:1] in (["-h"], ["--help"]) and default is not None:
        argv = [default, "--help"]
    if argv[:1] in (["-h"], ["--help"]) or (not argv and default is None):
        print(usage(commands, prog, description), file=sys.stdout if argv else sys.stderr)
        return EXIT_OK if argv else EXIT_USAGE
    if default is not None and (not argv or argv[0].startswith("-")):
        argv = [default, *argv]
    name, rest = argv[0], argv[1:]
    command = table.get(name)
    if command is None:
        near = difflib.get_close_matches(name, table, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f"; one of: {', '.join(table)}"
        print(f"{prog}: unknown command '{name}'{hint}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return command.load()(rest)
    except KimidflashError as exc:
        status = exit_status(exc)
        if status is None:
            raise
        print(f"{prog} {name}: {exc}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"{prog} {name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
