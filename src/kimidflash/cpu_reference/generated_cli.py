"""`kimidflash tiny-model`'s command line: its options parsed and checked, then `generated.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from .generated import KINDS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kimidflash tiny-model", description="write a seeded tiny target and its random DFlash drafter"
    )
    p.add_argument("target_dir", type=Path)
    p.add_argument("draft_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default="qwen3",
        help="qwen3: the tiny Qwen3 pair (tiny.py); kimi-k2.6: the tiny Kimi K2.6 (tiny_kimi.py); "
        "kimi-k2.6-eagle3: the same target and an EAGLE-3 MLA head (tiny_kimi_eagle3.py)",
    )
    args = p.parse_args(argv)
    KINDS[args.kind].generate(args.target_dir, args.draft_dir, args.seed)
    print(f"tiny {args.kind} target: {args.target_dir}\ntiny drafter: {args.draft_dir}")
    return 0
