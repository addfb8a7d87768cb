"""The standard launcher: refusals before exec, and both invocation forms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimidflash import launch
from kimidflash.launch import LaunchError, verify

from ..support.helpers import ROOT

LAUNCHER = ROOT / "launchers" / "kimi26-vllm-dflash.sh"
# The launcher runs `python3` from PATH, as it would inside a vLLM image or venv.
PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"


def report(tmp_path, **states):
    """A patch report in the patcher's shape; P10 is the FP8 KV group, as in patches/patchset.py."""
    path = tmp_path / "report.json"
    groups = {"P10": "5 FP8 KV running-max scale"}
    path.write_text(
        json.dumps(
            {
                "vllm_version": "0.33.0",
                "patches": [
                    {"id": k, "group": groups.get(k, "1 AITER FA non-causal"), "state": v} for k, v in states.items()
                ],
            }
        )
    )
    return path


def test_pin_mismatch_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "installed_vllm_version", lambda: "0.20.2+rocm641")
    with pytest.raises(LaunchError, match="installed vLLM is 0.20.2.*VLLM_VERSION=0.33.0"):
        verify({"KIMIDFLASH_VLLM_VERSION": "0.33.0"}, tmp_path / "none.json")
    monkeypatch.setattr(launch, "installed_vllm_version", lambda: "0.33.0+rocm700")
    assert verify({"KIMIDFLASH_VLLM_VERSION": "0.33.0"}, tmp_path / "none.json") == []


def test_drifted_report_is_refused(tmp_path):
    with pytest.raises(LaunchError, match="drift for P3"):
        verify({}, report(tmp_path, P1="upstream", P3="drift"))


def test_running_max_needs_the_fp8_patch(tmp_path):
    env = {"KIMIDFLASH_FP8_KV_SCALE": "running-max"}
    with pytest.raises(LaunchError, match="no patch report was found"):
        verify(env, tmp_path / "absent.json")
    with pytest.raises(LaunchError, match="not applied"):
        verify(env, report(tmp_path, P1="upstream", P10="not-applicable"))
    notes = verify(env, report(tmp_path, P1="upstream", P10="applied"))
    assert "P10=applied" in notes[0]


def test_dash_dash_form_execs_the_command_with_the_rendered_env(tmp_path):
    r = subprocess.run(
        [str(LAUNCHER), "--", "sh", "-c", 'echo "ran $KIMIDFLASH_MARK"'],
        capture_output=True,
        text=True,
        env={"PATH": PATH, "KIMIDFLASH_MARK": "yes", "KIMIDFLASH_PATCH_REPORT": str(tmp_path / "x")},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran yes"
    assert "exec sh -c" in r.stderr


def test_config_form_dry_run_and_refusals():
    ok = subprocess.run(
        [str(LAUNCHER), str(ROOT / "configs/production.env"), "--dry-run"],
        capture_output=True,
        text=True,
        env={"PATH": PATH},
    )
    assert ok.returncode == 0 and "vllm serve /models/Kimi-K2.6" in ok.stdout
    bad = subprocess.run(
        [str(LAUNCHER), str(ROOT / "configs/production.env"), "--set", "BLOCK_SIZE=8"],
        capture_output=True,
        text=True,
        env={"PATH": PATH},
    )
    assert bad.returncode == 2 and "BLOCK_SIZE" in bad.stderr
    fp8 = subprocess.run(
        [str(LAUNCHER), str(ROOT / "configs/production-fp8kv.env")],
        capture_output=True,
        text=True,
        env={"PATH": PATH, "KIMIDFLASH_PATCH_REPORT": "/nonexistent.json"},
    )
    assert fp8.returncode == 3 and "refusing to start" in fp8.stderr and "FP8 KV patch" in fp8.stderr


def test_missing_program_is_reported():
    r = subprocess.run([str(LAUNCHER), "--", "no-such-vllm-binary"], capture_output=True, text=True, env={"PATH": PATH})
    assert r.returncode == 127 and "cannot run no-such-vllm-binary" in r.stderr
