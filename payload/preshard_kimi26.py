#!/usr/bin/env python3
"""Pre-shard Kimi K2.6 (or any config's MODEL_DIR) for its tensor-parallel size, once.

    python3 payload/preshard_kimi26.py configs/production.env --out /models/Kimi-K2.6-tp8

A thin shim over `python -m kimidflash preshard` (runs from a checkout without
installing: it puts ../src first on sys.path). The saver itself runs in the
config's vLLM environment. See docs/preshard.md.
"""

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if (_SRC / "kimidflash" / "preshard").is_dir():
    sys.path.insert(0, str(_SRC))

try:
    from kimidflash.cli import main
except ImportError as e:  # the recipe's tools missing
    print(f"error: {e}; install the recipe's tools (pip install -e .)", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main(["preshard", *sys.argv[1:]]))
