"""Multi-turn load generator and reports for OpenAI-compatible servers (vLLM).

Why a package of our own rather than `vllm bench serve`: the recipe needs
multi-turn sessions, per-token ITL when speculative decoding delivers several
tokens in one SSE chunk, concurrency-slot waits counted in latency, and the
spec-decode counters of `/metrics` subtracted around the measured window.

Entry points:
- `run_benchmark(BenchConfig(...)) -> dict`: one run, returns the result document
  (see `result.py` for the schema); `write_result(path, doc)` stores it atomically.
- `kimidflash.bench.cli.main(argv)`: the command line (`payload/benchmark_multi_turn.py`,
  `python -m kimidflash bench`).
- `kimidflash.bench.report.compare(paths)`: the seed-style tables and charts.
- `kimidflash.bench.errors`: every error the package raises.
"""

from __future__ import annotations

from ..errors import BenchError
from .resultfile import SCHEMA_NAME, SCHEMA_VERSION, load_result, validate_result, write_result
from .runner import arun_benchmark, run_benchmark
from .settings import BenchConfig

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "BenchConfig",
    "BenchError",
    "arun_benchmark",
    "load_result",
    "run_benchmark",
    "validate_result",
    "write_result",
]
