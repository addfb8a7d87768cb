"""The FP8 KV running-max scale helper (patch P10), on its own: scales never decrease,
stay finite, use the right FP8 maximum per platform, and quantise-dequantise error
stays bounded on random KV; the vLLM hook is a no-op unless switched on."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

HELPER = Path(__file__).resolve().parents[1] / "patches" / "kimidflash_fp8_kv.py"


@pytest.fixture(scope="module")
def fp8():
    spec = importlib.util.spec_from_file_location("kimidflash_fp8_kv", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# (arch, dtype vLLM uses for "fp8", its max, smallest subnormal)
PLATFORMS = [
    ("gfx942", torch.float8_e4m3fnuz, 240.0, 2.0 ** -10),  # MI300X
    ("gfx950", torch.float8_e4m3fn, 448.0, 2.0 ** -9),     # MI355X: OCP
    (None, torch.float8_e4m3fn, 448.0, 2.0 ** -9),         # CUDA / CPU
]


@pytest.mark.parametrize("arch, dtype, fmax, _", PLATFORMS)
def test_fp8_maximum_per_platform(fp8, arch, dtype, fmax, _):
    assert fp8.fp8_dtype("fp8", arch) == dtype
    assert fp8.fp8_max("fp8", arch) == fmax
    assert fp8.fp8_max("fp8_e4m3", arch) == fmax
    assert fp8.fp8_max("fp8_e5m2", arch) == 57344.0


def test_arch_strings_with_features_and_this_machine(fp8, monkeypatch):
    assert fp8.e4m3_dtype_for_arch("gfx942:sramecc+:xnack-") == torch.float8_e4m3fnuz
    assert fp8.platform_arch() is None  # no ROCm GPU here: OCP e4m3fn
    assert fp8.fp8_max("fp8") == 448.0
    monkeypatch.setattr(fp8, "platform_arch", lambda: "gfx942")
    assert fp8.fp8_max("fp8") == 240.0


def batches(seed=0, n=12):
    """Random MLA-like KV batches (kv_c_normed, k_pe) whose magnitude wanders up and
    down, with occasional outliers."""
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        mag = float(torch.empty(1).uniform_(0.05, 20.0, generator=g))
        kv = torch.randn(int(torch.randint(1, 64, (1,), generator=g)), 512, generator=g) * mag
        pe = torch.randn(kv.shape[0], 64, generator=g) * mag * 0.5
        if i % 5 == 4:
            kv[0, 0] = mag * 40
        yield kv, pe


def test_scales_never_decrease_and_stay_finite(fp8):
    amax, scales, seen = None, [], 0.0
    for kv, pe in batches():
        amax, scale = fp8.running_max_scale(amax, (kv, pe), 240.0)
        seen = max(seen, float(kv.abs().max()), float(pe.abs().max()))
        scales.append(float(scale))
        assert float(amax) == pytest.approx(seen)
        assert float(scale) == pytest.approx(seen / 240.0)
    assert all(b >= a for a, b in zip(scales, scales[1:]))
    assert scales[-1] > scales[0]  # the batches did push it up
    # empty, NaN and inf batches change nothing; zeros never give a zero scale
    for bad in (torch.empty(0, 512), torch.full((2, 512), float("nan")),
                torch.full((2, 512), float("inf"))):
        a2, s2 = fp8.running_max_scale(amax, (bad, None), 240.0)
        assert float(a2) == float(amax) and float(s2) == scales[-1]
    assert fp8.running_max_scale(None, (torch.empty(0),), 240.0) == (None, None)
    _, s0 = fp8.running_max_scale(None, (torch.zeros(3, 4),), 240.0)
    assert 0 < float(s0) and torch.isfinite(s0)


@pytest.mark.parametrize("arch, dtype, fmax, tiny", PLATFORMS[:2])
def test_quantise_dequantise_error_is_bounded(fp8, arch, dtype, fmax, tiny):
    """Each batch is written with the scale after observing it: nothing clips and the
    error is within e4m3's rounding (3 mantissa bits) or one subnormal step."""
    amax = None
    for kv, pe in batches(seed=1):
        amax, scale = fp8.running_max_scale(amax, (kv, pe), fmax)
        for x in (kv, pe):
            q = (x / scale).to(dtype)
            assert torch.isfinite(q.float()).all()
            err = (q.float() * scale - x).abs()
            bound = torch.maximum(x.abs() * 2.0 ** -4, torch.full_like(x, tiny) * scale)
            assert (err <= bound * 1.0001).all(), float((err / bound).max())


def test_static_unit_scale_is_what_the_fix_is_for(fp8):
    """With vLLM's default scale 1.0 a large KV value does not survive e4m3fnuz;
    with the running-max scale it does."""
    x = torch.tensor([300.0, 0.01, -2.0])
    static = x.to(torch.float8_e4m3fnuz).float()
    assert not torch.isfinite(static).all() or (static - x).abs().max() > 1.0
    _, scale = fp8.running_max_scale(None, (x,), 240.0)
    back = (x / scale).to(torch.float8_e4m3fnuz).float() * scale
    assert (back - x).abs().max() <= 300.0 * 2.0 ** -4


class Layer:
    def __init__(self):
        self._k_scale = torch.tensor(1.0)
        self._v_scale = torch.tensor(1.0)
        self._k_scale_float = self._v_scale_float = 1.0


def test_observe_is_a_no_op_unless_enabled(fp8, monkeypatch):
    kv, pe = torch.randn(4, 512) * 3, torch.randn(4, 64)
    slots = torch.arange(4)
    monkeypatch.delenv(fp8.ENV, raising=False)
    layer = Layer()
    fp8.observe(layer, kv, pe, "fp8", slots)
    assert float(layer._k_scale) == 1.0 and not hasattr(layer, "_kimidflash_kv_amax")
    monkeypatch.setenv(fp8.ENV, "running-max")
    fp8.observe(layer, kv, pe, "auto", slots)  # not an FP8 cache
    fp8.observe(layer, kv, pe, "fp8", None)    # no real write (profiling)
    assert float(layer._k_scale) == 1.0 and layer._k_scale_float == 1.0


def test_observe_updates_layer_scales(fp8, monkeypatch):
    monkeypatch.setenv(fp8.ENV, "running-max")
    monkeypatch.setattr(fp8, "platform_arch", lambda: "gfx942")
    layer = Layer()
    kv, pe = torch.randn(6, 512), torch.randn(6, 64)
    kv[5] = 1000.0  # a padded row past the slot mapping must be ignored
    fp8.observe(layer, kv, pe, "fp8", torch.arange(5))
    want = max(float(kv[:5].abs().max()), float(pe[:5].abs().max())) / 240.0
    assert float(layer._k_scale) == pytest.approx(want)
    assert float(layer._v_scale) == pytest.approx(want)
    assert layer._k_scale_float == pytest.approx(want) == layer._v_scale_float
    fp8.observe(layer, kv[:5] * 0.1, pe[:5] * 0.1, "fp8", torch.arange(5))
    assert float(layer._k_scale) == pytest.approx(want)  # smaller batch: unchanged


def test_bad_policy_value_names_the_culprit(fp8, monkeypatch):
    monkeypatch.setenv(fp8.ENV, "runing-max")
    with pytest.raises(ValueError, match="KIMIDFLASH_FP8_KV_SCALE='runing-max'"):
        fp8.enabled()
    monkeypatch.setenv(fp8.ENV, "static")
    assert fp8.enabled() is False
