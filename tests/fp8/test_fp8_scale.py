"""The FP8 KV running-max scale helper (patch P10), on its own: only real rows count,
scales never decrease and stay finite, use the right FP8 maximum per platform, a
growth rescales the cache so earlier entries read back as written, a calibration
file seeds the scale, and the vLLM hook is a no-op unless switched on. Fast tier:
torch is in the project venv. tests/fp8/test_fp8_p10_patched.py drives the same helper
through the patched vLLM trees."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

HELPER = Path(__file__).resolve().parents[2] / "patches" / "kimidflash_fp8_kv.py"


@pytest.fixture(scope="module")
def fp8():
    spec = importlib.util.spec_from_file_location("kimidflash_fp8_kv", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# (arch, dtype vLLM uses for "fp8", its max, smallest subnormal)
PLATFORMS = [
    ("gfx942", torch.float8_e4m3fnuz, 240.0, 2.0**-10),  # MI300X
    ("gfx950", torch.float8_e4m3fn, 448.0, 2.0**-9),  # MI355X: OCP
    (None, torch.float8_e4m3fn, 448.0, 2.0**-9),  # CUDA / CPU
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


def test_batch_amax_counts_only_real_finite_rows(fp8):
    kv, pe = torch.randn(6, 512), torch.randn(6, 1, 64)
    kv[1, 3], kv[4, 0], pe[5, 0, 0] = 50.0, float("nan"), 900.0  # row 5: padding, past the slots
    slots = torch.tensor([0, -1, 2, 3, 4])  # row 1 is a dummy/padded row
    want = max(float(kv[[0, 2, 3]].abs().max()), float(kv[4, 1:].abs().max()), float(pe[:5][[0, 2, 3, 4]].abs().max()))
    assert float(fp8.batch_amax((kv, pe), slots)) == pytest.approx(want)
    assert float(fp8.batch_amax((kv, pe), torch.full((5,), -1))) == 0.0  # a dummy run
    assert float(fp8.batch_amax((torch.empty(0, 512), None), torch.empty(0, dtype=torch.long))) == 0.0


def test_scales_never_decrease_and_stay_finite(fp8, monkeypatch):
    monkeypatch.setenv(fp8.ENV, "running-max")
    layer, scales, seen = Layer(), [], 0.0
    for kv, pe in batches():
        fp8.observe(layer, kv, pe, "fp8", torch.arange(kv.shape[0]))
        seen = max(seen, float(kv.abs().max()), float(pe.abs().max()))
        scales.append(float(layer._k_scale))
        cap = layer._kimidflash_kv_state.capacity
        assert seen <= cap <= seen * fp8.DEFAULT_HEADROOM * 1.0001  # covers all seen, within headroom
        assert float(layer._k_scale) == pytest.approx(cap / 448.0)
    assert all(b >= a for a, b in zip(scales, scales[1:], strict=False))
    assert scales[-1] > scales[0]  # the batches did push it up
    for bad in (
        torch.empty(0, 512),
        torch.full((2, 512), float("nan")),
        torch.full((2, 512), float("inf")),
        torch.zeros(2, 512),
    ):
        fp8.observe(layer, bad, None, "fp8", torch.arange(bad.shape[0]))
        assert float(layer._k_scale) == scales[-1]


@pytest.mark.parametrize("arch, dtype, fmax, tiny", PLATFORMS[:2])
def test_quantise_dequantise_error_is_bounded(fp8, monkeypatch, arch, dtype, fmax, tiny):
    """Each batch is written with the scale after observing it: nothing clips and the
    error is within e4m3's rounding (3 mantissa bits) or one subnormal step."""
    monkeypatch.setenv(fp8.ENV, "running-max")
    monkeypatch.setattr(fp8, "platform_arch", lambda: arch)
    layer = Layer()
    for kv, pe in batches(seed=1):
        fp8.observe(layer, kv, pe, "fp8", torch.arange(kv.shape[0]))
        scale = float(layer._k_scale)
        for x in (kv, pe):
            q = (x / scale).to(dtype)
            assert torch.isfinite(q.float()).all()
            err = (q.float() * scale - x).abs()
            bound = torch.maximum(x.abs() * 2.0**-4, torch.full_like(x, tiny) * scale)
            assert (err <= bound * 1.0001).all(), float((err / bound).max())


def test_static_unit_scale_is_what_the_fix_is_for(fp8, monkeypatch):
    """With vLLM's default scale 1.0 a large KV value does not survive e4m3fnuz;
    with the running-max scale it does."""
    monkeypatch.setenv(fp8.ENV, "running-max")
    monkeypatch.setattr(fp8, "platform_arch", lambda: "gfx942")
    x = torch.tensor([[300.0, 0.01, -2.0]])
    static = x.to(torch.float8_e4m3fnuz).float()
    assert not torch.isfinite(static).all() or (static - x).abs().max() > 1.0
    layer = Layer()
    fp8.observe(layer, x, None, "fp8", torch.arange(1))
    scale = float(layer._k_scale)
    back = (x / scale).to(torch.float8_e4m3fnuz).float() * scale
    assert (back - x).abs().max() <= 300.0 * 2.0**-4


def write(cache, rows, slots, scale, dtype):
    """What the cache kernel stores: fp8(x / scale) at each slot (block, offset)."""
    cache.view(dtype)[slots // cache.shape[1], slots % cache.shape[1]] = (rows / scale).to(dtype)


@pytest.mark.parametrize("strided", [False, True])
def test_growth_rescales_the_cache_so_old_entries_read_back_as_written(fp8, monkeypatch, strided):
    """The in-flight case on plain tensors: entries written at the old scale, then a
    4x larger batch; read at the new scale, the old entries are still right. Also for a
    cache bound as a strided view of a larger buffer (the rescale must not copy)."""
    monkeypatch.setenv(fp8.ENV, "running-max")
    dtype = torch.float8_e4m3fn
    layer = Layer()
    buffer = torch.zeros(4, 2, 16, 576, dtype=torch.uint8)
    layer.kv_cache = buffer[:, 0] if strided else buffer[:, 0].clone()
    g = torch.Generator().manual_seed(3)
    old = torch.randn(16, 576, generator=g) * 3
    fp8.observe(layer, old[:, :512], old[:, 512:], "fp8", torch.arange(16))
    write(layer.kv_cache, old, torch.arange(16), float(layer._k_scale), dtype)
    first_scale = float(layer._k_scale)
    new = torch.randn(16, 576, generator=g) * 12
    fp8.observe(layer, new[:, :512], new[:, 512:], "fp8", torch.arange(16, 32))
    write(layer.kv_cache, new, torch.arange(16, 32), float(layer._k_scale), dtype)
    assert float(layer._k_scale) > 3.5 * first_scale and layer._kimidflash_kv_state.growths == 1
    slots = torch.arange(32)
    back = layer.kv_cache.view(dtype)[slots // 16, slots % 16].float() * float(layer._k_scale)
    for rows, got in ((old, back[:16]), (new, back[16:32])):
        assert float((got - rows).abs().max() / rows.abs().max()) < 2 * 2**-4 + 0.005
    if strided:
        assert buffer[:, 1].count_nonzero() == 0  # the neighbouring view is untouched


def test_a_calibration_file_seeds_each_layer(fp8, monkeypatch, tmp_path):
    monkeypatch.setenv(fp8.ENV, "running-max")
    path = tmp_path / "scales.json"
    path.write_text(
        json.dumps(
            {
                "schema": "kimidflash-kv-scales/1",
                "headroom": 1.5,
                "layers": [{"index": 0, "k_amax": 2.0}, {"index": 1, "k_amax": 8.0}],
            }
        )
    )
    monkeypatch.setenv(fp8.SCALES_ENV, str(path))
    fp8.load_seed.cache_clear()
    layers = [Layer(f"model.layers.{i}.self_attn.attn") for i in (0, 1)]
    kv = torch.full((2, 512), 1.0)
    for layer in layers:
        fp8.observe(layer, kv, None, "fp8", torch.arange(2))  # within capacity: no change
    assert [float(x._k_scale) for x in layers] == pytest.approx([3.0 / 448, 12.0 / 448])
    assert [x._kimidflash_kv_state.growths for x in layers] == [0, 0]
    fp8.observe(layers[0], kv * 4, None, "fp8", torch.arange(2))  # 4 > 3: grows to 4 x 1.5
    assert float(layers[0]._k_scale) == pytest.approx(6.0 / 448)
    missing = Layer("model.layers.7.self_attn.attn")
    with pytest.raises(ValueError, match="no scale for layer 'model.layers.7.self_attn.attn'"):
        fp8.observe(missing, kv, None, "fp8", torch.arange(2))


@pytest.mark.parametrize(
    "content, match",
    [
        ("{", "cannot read"),
        ('{"schema": "other"}', "not a kimidflash-kv-scales/1 file"),
        ('{"schema": "kimidflash-kv-scales/1", "headroom": 1.25, "layers": [{"index": 0}]}', "malformed"),
        ('{"schema": "kimidflash-kv-scales/1", "headroom": 0.5, "layers": [{"index": 0, "k_amax": 1}]}', "headroom"),
        (
            '{"schema": "kimidflash-kv-scales/1", "headroom": 1.25, "layers": [{"index": 0, "k_amax": 0}]}',
            "layers \\[0\\]",
        ),
    ],
)
def test_a_bad_calibration_file_names_itself(fp8, tmp_path, content, match):
    path = tmp_path / "s.json"
    path.write_text(content)
    fp8.load_seed.cache_clear()
    with pytest.raises(ValueError, match=match) as exc:
        fp8.load_seed(str(path))
    assert str(path) in str(exc.value)


class Layer:
    def __init__(self, name="model.layers.0.self_attn.attn"):
        self.layer_name = name
        self._k_scale = torch.tensor(1.0)
        self._v_scale = torch.tensor(1.0)
        self._k_scale_float = self._v_scale_float = 1.0


def test_observe_is_a_no_op_unless_enabled(fp8, monkeypatch):
    kv, pe = torch.randn(4, 512) * 3, torch.randn(4, 64)
    slots = torch.arange(4)
    monkeypatch.delenv(fp8.ENV, raising=False)
    layer = Layer()
    fp8.observe(layer, kv, pe, "fp8", slots)
    assert float(layer._k_scale) == 1.0 and not hasattr(layer, "_kimidflash_kv_state")
    monkeypatch.setenv(fp8.ENV, "running-max")
    fp8.observe(layer, kv, pe, "auto", slots)  # not an FP8 cache
    fp8.observe(layer, kv, pe, "fp8", None)  # no real write (profiling)
    assert float(layer._k_scale) == 1.0 and layer._k_scale_float == 1.0


def test_observe_updates_layer_scales(fp8, monkeypatch):
    monkeypatch.setenv(fp8.ENV, "running-max")
    monkeypatch.setattr(fp8, "platform_arch", lambda: "gfx942")
    layer = Layer()
    kv, pe = torch.randn(6, 512), torch.randn(6, 64)
    kv[5] = 1000.0  # a padded row past the slot mapping must be ignored
    fp8.observe(layer, kv, pe, "fp8", torch.arange(5))
    want = max(float(kv[:5].abs().max()), float(pe[:5].abs().max())) * fp8.DEFAULT_HEADROOM / 240.0
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
