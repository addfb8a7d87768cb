"""Running-max FP8 KV-cache scales for vLLM's MLA cache writes (kimidflash patch P10).

Why: Kimi K2.6 ships no KV-cache scales, so vLLM writes its FP8 MLA cache with the
default scale 1.0: small latent values lose precision and large ones clip. This
module keeps, per attention layer, the largest |value| written so far (over both
kv_c_normed and k_pe, which share one cache entry and one scale) and sets the
layer's k/v scale to amax / FP8_MAX, so the scale only grows.

The patcher installs this file as ``vllm/_kimidflash_fp8_kv.py`` and the patched
MLA write path calls ``observe`` before every cache write. It does nothing unless
``KIMIDFLASH_FP8_KV_SCALE=running-max`` (the serve renderer sets it from the config's
KV_SCALE_POLICY), so without the variable vLLM behaves exactly as upstream.

Caveats, by design of a single per-layer scale: entries already in the cache are
read back with the newest scale, so a scale that grows after serving began shrinks
older entries by old/new; warm the server up (e.g. with the calibration prompts)
before taking traffic. Each update reads the scale back to the host (``.item()``),
which CUDA graphs cannot capture: use it with enforce-eager, as the recipe does.
"""
from __future__ import annotations

import functools
import os

import torch

ENV = "KIMIDFLASH_FP8_KV_SCALE"
POLICY = "running-max"
_OFF = ("", "static", "off")
_AMAX_ATTR = "_kimidflash_kv_amax"
# A scale of 0 would divide by zero in the cache-write kernels.
_MIN_SCALE = 1e-12


def enabled() -> bool:
    """True when the running-max policy is switched on by the environment."""
    value = os.environ.get(ENV, "").strip()
    if value == POLICY:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{ENV}={value!r}: expected {POLICY!r} or unset")


def e4m3_dtype_for_arch(arch: str | None) -> torch.dtype:
    """FP8 e4m3 flavour of a GPU architecture: MI300-class (gfx94x) uses e4m3fnuz
    (max 240); everything else (gfx950, CUDA, CPU) uses OCP e4m3fn (max 448)."""
    if arch and arch.split(":")[0].startswith("gfx94"):
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


@functools.lru_cache(maxsize=None)
def platform_arch() -> str | None:
    """The first visible ROCm GPU's gfx architecture, or None off ROCm."""
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    return None


def fp8_dtype(kv_cache_dtype: str, arch: str | None = None) -> torch.dtype:
    """The torch dtype vLLM stores for ``kv_cache_dtype`` on ``arch`` (default: this
    machine's GPU)."""
    if kv_cache_dtype == "fp8_e5m2":
        return torch.float8_e5m2
    return e4m3_dtype_for_arch(arch if arch is not None else platform_arch())


def fp8_max(kv_cache_dtype: str = "fp8", arch: str | None = None) -> float:
    """Largest finite value of the cache's FP8 format (240, 448 or 57344)."""
    return float(torch.finfo(fp8_dtype(kv_cache_dtype, arch)).max)


def running_max_scale(
    prev_amax: torch.Tensor | None, tensors, fmax: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Fold a batch into the running |max| and return ``(amax, scale)``.

    Empty or non-finite batches leave the state unchanged, so the scale never
    decreases and never becomes inf/NaN; ``(None, None)`` means nothing observed yet.
    """
    batch = [t.detach().abs().amax().float() for t in tensors if t is not None and t.numel()]
    amax = prev_amax
    if batch:
        cur = torch.stack(batch).amax()
        if bool(torch.isfinite(cur)):
            amax = cur if prev_amax is None else torch.maximum(prev_amax, cur.to(prev_amax.device))
    if amax is None:
        return None, None
    return amax, (amax / fmax).clamp_min(_MIN_SCALE)


def observe(layer, kv_c_normed, k_pe, kv_cache_dtype: str, slot_mapping=None) -> None:
    """Update ``layer``'s KV scales before an FP8 MLA cache write (no-op unless enabled,
    the cache is FP8 and the write is real, i.e. has a slot mapping)."""
    if slot_mapping is None or not str(kv_cache_dtype).startswith("fp8") or not enabled():
        return
    n = slot_mapping.shape[0]
    amax, scale = running_max_scale(
        getattr(layer, _AMAX_ATTR, None), (kv_c_normed[:n], k_pe[:n]), fp8_max(kv_cache_dtype)
    )
    if amax is None:
        return
    setattr(layer, _AMAX_ATTR, amax)
    for name in ("_k_scale", "_v_scale"):
        getattr(layer, name).copy_(scale)
    value = float(scale)
    layer._k_scale_float = value
    layer._v_scale_float = value
