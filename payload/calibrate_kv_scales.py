#!/usr/bin/env python3
"""FP8 KV-cache scale calibration (the seed's layout names this file).

    python3 payload/calibrate_kv_scales.py /models/Kimi-K2.6 --output kv-scales.json \
        --overlay /models/Kimi-K2.6-kv --num-prompts 200 --max-tokens 4096

A thin shim over `python -m kimidflash calibrate`; runs from a checkout without
installing (it puts ../src first on sys.path). Needs torch, transformers and rich.
See docs/fp8-kv.md.
"""

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if (_SRC / "kimidflash" / "fp8").is_dir():
    sys.path.insert(0, str(_SRC))

try:
    from kimidflash.cli import main
    from kimidflash.fp8 import calibrate  # noqa: F401  (its dependencies, checked here)
except ImportError as e:  # rich missing
    print(f"error: {e}; install the recipe's tools (pip install -e .) or 'pip install rich'", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main(["calibrate", *sys.argv[1:]]))
