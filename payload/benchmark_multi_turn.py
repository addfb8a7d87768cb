#!/usr/bin/env python3
"""Multi-turn streaming benchmark (seed-compatible command line).

    python3 payload/benchmark_multi_turn.py --base-url http://localhost:8262/v1 \
        --model kimi-k2.6-amd-dflash --sessions 32 --turns-per-session 1 --max-tokens 512 \
        --output results/dflash-c32.json
    python3 payload/benchmark_multi_turn.py compare baseline-*.json dflash-*.json --markdown report.md --charts charts/

A thin shim over `kimidflash.bench.cli` (the same command table as
`python -m kimidflash bench`); runs from a checkout without installing (it puts
../src first on sys.path). Needs httpx and rich
(matplotlib for charts). See docs/benchmarking.md.
"""

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if (_SRC / "kimidflash" / "bench").is_dir():
    sys.path.insert(0, str(_SRC))

try:
    from kimidflash.bench.cli import main
except ImportError as e:  # httpx / rich missing
    print(f"error: {e}; install the recipe's tools (pip install -e .) or 'pip install httpx rich'", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
