"""FP8 formats a KV cache is stored in, and how a scale is expressed for each.

vLLM stores x / scale in the cache and reads back q * scale. A scale therefore has
to be amax * headroom / FP8_MAX[format] for the values seen to fit.

The scales JSON records per-layer scales in OCP e4m3fn units (max 448), the units
llm-compressor writes. What vLLM does with a loaded checkpoint scale depends on the
quantization method: ``BaseKVCacheMethod`` (the fp8, ModelOpt and Quark methods)
doubles it on an e4m3fnuz platform (MI300X, gfx942: max 240, the same bits worth
half); the compressed-tensors method, which the recipe's overlay uses, takes it as it
is on every pin read. So an overlay carries scales for the serving platform's own
format (``KvScales.scales_for``), and nothing here applies a doubling.
"""

from __future__ import annotations

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0, "e5m2": 57344.0}
CHECKPOINT_FORMAT = "e4m3fn"  # units of the scales JSON's per-layer k_scale / v_scale
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
