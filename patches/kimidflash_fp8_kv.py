"""Running-max FP8 KV-cache scales for vLLM's MLA cache writes (kimidflash patch P10).

Why: Kimi K2.6 ships no KV-cache scales, so vLLM writes its FP8 MLA cache with the
default scale 1.0: small latent values lose precision and large ones clip. The
patched MLA write path calls ``observe`` before every cache write; with
``KIMIDFLASH_FP8_KV_SCALE=running-max`` (set by the serve renderer from the config's
KV_SCALE_POLICY) it keeps, per attention layer, one scale that covers the largest
|value| written so far over both ``kv_c_normed`` and ``k_pe`` (they share one cache
entry and one scale, vLLM's ``_k_scale``). Without the variable vLLM behaves exactly
as upstream.

What it guarantees, and how:

* Cached entries keep their meaning. vLLM stores x / scale and reads q * scale with
  the layer's current scale, so raising the scale after entries were written would
  make every older entry read back larger by new/old. Whenever the scale must grow,
  this module first rescales the layer's whole cache by old/new (in chunks), so every
  entry reads back at the value it was written with, to FP8 rounding.
* Only real writes count: rows whose slot mapping is negative (vLLM's dummy runs
  right after the cache is allocated, padded rows) are masked out, and so are
  non-finite values.
* A scale can start from calibration: ``KIMIDFLASH_FP8_KV_SCALES=<scales JSON>`` (the
  ``kimidflash calibrate`` output, schema kimidflash-kv-scales/1) seeds every layer
  with its calibrated maximum times the file's headroom; without it a layer's first
  real write sets its scale. Growth then needs a value beyond that capacity, and each
  growth leaves the same headroom above the new maximum, so growth events are few
  and each is logged.
* One host sync per MLA layer per step (reading the batch maximum back to compare it
  with the capacity), which CUDA graphs cannot capture: the recipe's validator
  refuses this policy without enforce-eager.

The patcher installs this file as ``vllm/_kimidflash_fp8_kv.py``; it needs only the
stdlib and torch.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import struct

import torch

ENV = "KIMIDFLASH_FP8_KV_SCALE"
SCALES_ENV = "KIMIDFLASH_FP8_KV_SCALES"
POLICY = "running-max"
SCALES_SCHEMA = "kimidflash-kv-scales/1"
_OFF = ("", "static", "off")
_STATE = "_kimidflash_kv_state"
DEFAULT_HEADROOM = 1.25  # as kimidflash.fp8.formats.DEFAULT_HEADROOM
# Rows of the cache rescaled per chunk: bounds the float32 temporary to a few MB.
_RESCALE_CHUNK_BYTES = 64 << 20
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")

log = logging.getLogger("vllm.kimidflash_fp8_kv")


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


@functools.cache
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


def layer_index(layer_name: str) -> int | None:
    """'model.layers.12.self_attn.attn' -> 12."""
    m = _LAYER_INDEX.search(layer_name or "")
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=8)
def load_seed(path: str) -> tuple[float, dict[int, float]]:
    """(headroom, {layer index: k_amax}) from a calibration file; errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{SCALES_ENV}={path}: cannot read the scales file: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCALES_SCHEMA:
        raise ValueError(f"{SCALES_ENV}={path}: not a {SCALES_SCHEMA} file")
    try:
        headroom = float(data["headroom"])
        amax = {int(ly["index"]): float(ly["k_amax"]) for ly in data["layers"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{SCALES_ENV}={path}: malformed layers: {exc!r}") from None
    bad = [i for i, a in amax.items() if not (math.isfinite(a) and a > 0)]
    if not (math.isfinite(headroom) and headroom >= 1.0) or bad:
        raise ValueError(f"{SCALES_ENV}={path}: headroom must be >= 1 and every k_amax finite and > 0 (layers {bad})")
    return headroom, amax


def batch_amax(tensors, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Largest finite |value| over the rows really written (slot >= 0), on the device:
    0 when no row is real. Rows beyond the slot mapping are padding and never count."""
    n = slot_mapping.shape[0]
    out = torch.zeros((), dtype=torch.float32, device=slot_mapping.device)
    if n == 0:
        return out
    real = slot_mapping.reshape(n, -1)[:, 0] >= 0
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        rows = t[:n].detach().reshape(n, -1).abs().float()
        rows = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows)).amax(dim=1)
        out = torch.maximum(out, torch.where(real, rows, torch.zeros_like(rows)).amax())
    return out


def rescale_cache(cache: torch.Tensor, ratio: float, dtype: torch.dtype) -> None:
    """Multiply every FP8 entry of ``cache`` by ``ratio`` (< 1) in place, in chunks.

    Entries stored as x / old read back as x once the scale is new, because each now
    holds (x / old) * (old / new) = x / new. ``ratio`` < 1 cannot overflow the format.
    Works on strided views (vLLM may bind a layer's cache as a view of a larger
    buffer): it slices along the first dimension and never flattens.
    """
    if cache is None or cache.dim() == 0 or cache.numel() == 0:
        return
    view = cache if cache.dtype == dtype else cache.view(dtype)
    per_row = max(1, view[0].numel())
    step = max(1, _RESCALE_CHUNK_BYTES // (4 * per_row))
    for start in range(0, view.shape[0], step):
        part = view[start : start + step]
        part.copy_((part.float() * ratio).to(dtype))


class _State:
    """Per-layer host-side state: the value capacity of the current scale."""

    __slots__ = ("capacity", "headroom", "growths")

    def __init__(self, capacity: float | None, headroom: float):
        self.capacity, self.headroom, self.growths = capacity, headroom, 0


def _state(layer, fmax: float) -> _State:
    state = getattr(layer, _STATE, None)
    if state is None:
        path = os.environ.get(SCALES_ENV, "").strip()
        state = _State(None, DEFAULT_HEADROOM)
        if path:
            headroom, amax = load_seed(path)
            index = layer_index(getattr(layer, "layer_name", ""))
            if index not in amax:
                raise ValueError(f"{SCALES_ENV}={path} has no scale for layer {layer.layer_name!r}")
            state = _State(amax[index] * headroom, headroom)
            _set_scale(layer, state.capacity / fmax)
        setattr(layer, _STATE, state)
    return state


def _set_scale(layer, scale: float) -> None:
    """Device buffers and the host copies backends read, equal to the bit (float32)."""
    scale = struct.unpack("f", struct.pack("f", scale))[0]
    for name in ("_k_scale", "_v_scale"):
        getattr(layer, name).fill_(scale)
    layer._k_scale_float = scale
    layer._v_scale_float = scale


def observe(layer, kv_c_normed, k_pe, kv_cache_dtype: str, slot_mapping=None) -> None:
    """Before an FP8 MLA cache write: make ``layer``'s scale cover the batch's real rows,
    rescaling the layer's cache first when the scale grows. No-op unless enabled and
    the cache is FP8."""
    if slot_mapping is None or not str(kv_cache_dtype).startswith("fp8") or not enabled():
        return
    fmax = fp8_max(kv_cache_dtype)
    state = _state(layer, fmax)
    amax = float(batch_amax((kv_c_normed, k_pe), slot_mapping))  # the one host sync
    if amax <= 0.0 or (state.capacity is not None and amax <= state.capacity):
        return
    new_capacity = amax * state.headroom
    new_scale = new_capacity / fmax
    if state.capacity is not None:  # entries were written at the old scale
        rescale_cache(getattr(layer, "kv_cache", None), state.capacity / new_capacity, fp8_dtype(kv_cache_dtype))
        state.growths += 1
        log.warning(
            "kimidflash P10: %s KV scale %.6g -> %.6g (batch max %.6g); cache rescaled, growth %d",
            getattr(layer, "layer_name", "?"),
            state.capacity / fmax,
            new_scale,
            amax,
            state.growths,
        )
    state.capacity = new_capacity
    _set_scale(layer, new_scale)
