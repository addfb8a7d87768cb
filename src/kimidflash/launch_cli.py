"""`kimidflash launch`'s command line: its options parsed and checked, then `launch.py` called."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .cliargs import add_config
from .config import load_config
from .errors import ExecError, UsageError
from .launch import verify
from .render import render


def main(argv: list[str]) -> int:
    """`python -m kimidflash launch` (launchers/kimi26-vllm-dflash.sh): render a config, or
    take a rendered command after `--`, check the runtime against it, exec vLLM."""
    argv = list(argv)
    if argv[:1] == ["--"]:
        cmd, env = argv[1:], {}
        if not cmd:
            raise UsageError("nothing to run after --")
        env = {k: v for k, v in os.environ.items() if k.startswith("KIMIDFLASH_")}
    else:
        p = argparse.ArgumentParser(prog="kimi26-vllm-dflash.sh", description="Render a config and exec vLLM.")
        add_config(p)
        p.add_argument("--dry-run", action="store_true", help="print the command and exit")
        args = p.parse_args(argv)
        rendered = render(load_config(args.config, args.set))
        if args.dry_run:
            print(rendered.shell())
            return 0
        cmd, env = rendered.argv, rendered.env
    for note in verify(env):
        print(f"kimi26-vllm-dflash: {note}", file=sys.stderr)
    print(f"kimi26-vllm-dflash: exec {shlex.join(cmd)}", file=sys.stderr, flush=True)
    try:
        os.execvpe(cmd[0], cmd, {**os.environ, **env})
    except OSError as exc:
        raise ExecError(f"cannot run {cmd[0]}: {exc.strerror}") from None
    return 0  # not reached
