"""FP8 formats a KV cache is stored in, and how a scale is expressed for each.

vLLM stores x / scale in the cache and reads back q * scale. A scale therefore has
to be amax * headroom / FP8_MAX[format] for the values seen to fit.

Checkpoint ``k_scale`` / ``v_scale`` tensors are written in OCP e4m3fn units
(max 448): that is what llm-compressor's ``kv_cache_scheme`` writes and what vLLM's
``BaseKVCacheMethod`` reads. On an e4m3fnuz platform (MI300X, gfx942: max 240, the
same bits worth half) vLLM doubles a loaded scale, so a checkpoint scale of
amax/448 becomes amax/224 at run time and the largest value stored is 224 < 240.
"""

from __future__ import annotations

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0, "e5m2": 57344.0}
CHECKPOINT_FORMAT = "e4m3fn"
# Factor vLLM applies to a checkpoint scale when the platform's FP8 is e4m3fnuz.
FNUZ_CHECKPOINT_FACTOR = 2.0
# Room above the largest calibrated value before a write clips: 1.25 costs a third of
# a bit of precision and absorbs activations 25% larger than any seen in calibration.
DEFAULT_HEADROOM = 1.25


def platform_format(platform: str, kv_cache_dtype: str = "fp8", gfx: str = "gfx942") -> str:
    """The format a ``--kv-cache-dtype`` is stored in on a platform ('rocm' or 'cpu').

    ROCm gfx94x (MI300X/MI325X) uses e4m3fnuz; gfx950, CUDA and CPU use OCP e4m3fn.
    """
    if kv_cache_dtype == "fp8_e5m2":
        return "e5m2"
    if platform == "rocm" and gfx.startswith("gfx94"):
        return "e4m3fnuz"
    return "e4m3fn"


def scale_for(amax: float, fmt: str, headroom: float = DEFAULT_HEADROOM) -> float:
    """The scale that maps amax * headroom onto the format's largest value."""
    if fmt not in FP8_MAX:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected one of {', '.join(FP8_MAX)}")
    if not (amax > 0 and amax != float("inf")):
        raise ValueError(f"amax must be finite and positive, got {amax!r}")
    if headroom < 1.0:
        raise ValueError(f"headroom must be >= 1.0, got {headroom!r}")
    return amax * headroom / FP8_MAX[fmt]


def runtime_scale_from_checkpoint(scale: float, fmt: str) -> float:
    """What vLLM uses at run time for a checkpoint scale on a platform of format ``fmt``."""
    return scale * FNUZ_CHECKPOINT_FACTOR if fmt == "e4m3fnuz" else scale
