"""Fast tier: the patcher's guarantees under adversarial trees (synthetic, no downloads).

Each case runs the real script in a subprocess and checks its exit code, a one-line
message without a traceback, and a tree byte-identical to what it was before:
patched text edited after apply (insert-style and replace-style patches), a changed
patch set on a patched tree, a retired patch's marker left by an older set, files
modified before the first run, and nightly and other non-release version strings
(with and without --assume-version). I/O failures as a non-root user are in
test_patcher_io.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.patches.test_patcher import PATCHES, engine, make_tree, patcher, snapshot, states, write_patchset

NIGHTLY = "0.19.2.dev312+g1a2b3c.rocm700"  # the kind of build the seed ran
C_PY = "def g(x, y):\n    ok = x > 0\n    return ok\n"
# Insert-style: the replacement keeps the anchor, as P3, P5, P6, P8 and P10 do.
INSERT = {
    "id": "I1",
    "group": "g",
    "what": "wi",
    "why": "yi",
    "upstream": None,
    "variants": [
        {
            "versions": [["1.0.0", "2.0.0"]],
            "file": "c.py",
            "edits": [
                {
                    "anchor": "    ok = x > 0\n",
                    "replace": "    ok = x > 0\n    # kimidflash:I1 guard\n    ok = ok and not y\n",
                }
            ],
        }
    ],
}


@pytest.fixture
def setup(tmp_path):
    pkg = make_tree(tmp_path)
    ps = write_patchset(tmp_path)
    return pkg, ps, tmp_path


def with_insert(tmp_path: Path, version="1.5.0", replace=None) -> tuple[Path, Path]:
    pkg = make_tree(tmp_path, version=version)
    (pkg / "c.py").write_text(C_PY)
    return pkg, write_insert_set(tmp_path, replace)


def write_insert_set(tmp_path: Path, replace=None, why=None) -> Path:
    patches = json.loads(json.dumps(PATCHES + [INSERT]))
    if replace is not None:
        patches[-1]["variants"][0]["edits"][0]["replace"] = replace
    if why is not None:
        patches[-1]["why"] = why
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_patchset(tmp_path, patches)


def tree_hash(pkg: Path) -> str:
    """One sha256 over every file's path and bytes (temporary leftovers included)."""
    h = hashlib.sha256()
    for rel, data in snapshot(pkg).items():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def one_line_failure(r, code: int, *needles: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and ln != "patch_dflash_rocm: nothing was changed"]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ---------------------------------------------------------------- markers
def test_marker_is_stamped_with_the_documented_hash(tmp_path):
    pkg, ps = with_insert(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    v = INSERT["variants"][0]
    e = v["edits"][0]
    want = hashlib.sha256("\0".join(["I1", "c.py", e["anchor"], e["replace"]]).encode()).hexdigest()[:12]
    assert engine.variant_hash("I1", v) == want
    assert (pkg / "c.py").read_text() == (
        f"def g(x, y):\n    ok = x > 0\n    # kimidflash:I1@{want} guard\n    ok = ok and not y\n    return ok\n"
    )
    manifest = json.loads((pkg / engine.MANIFEST).read_text())
    assert manifest["files"]["c.py"]["original_sha256"] == hashlib.sha256(C_PY.encode()).hexdigest()


@pytest.mark.parametrize(
    "edit, culprit",
    [
        (lambda e: e.update(anchor="x = 1  # kimidflash:I1\n"), "an anchor carries a kimidflash marker"),
        (
            lambda e: e.update(replace=e["replace"].replace("kimidflash:I1", "kimidflash:I1@0123456789ab")),
            "carries a stamped marker",
        ),
        (lambda e: e.update(replace=e["replace"] + "# kimidflash:T2\n"), "another patch's marker 'kimidflash:T2'"),
        (
            lambda e: e.update(replace=e["replace"].replace("kimidflash:I1", "kimidflash:I10")),
            "lacks the marker 'kimidflash:I1'",
        ),
    ],
)
def test_patch_set_markers_are_validated(tmp_path, edit, culprit):
    patches = json.loads(json.dumps(PATCHES + [INSERT]))
    edit(patches[-1]["variants"][0]["edits"][0])
    pkg = make_tree(tmp_path)
    one_line_failure(patcher("--vllm-root", pkg, "--patch-set", write_patchset(tmp_path, patches)), 2, culprit)


@pytest.mark.parametrize("mode", ["apply", "--check", "--dry-run", "--revert"])
def test_reformatted_insert_style_line_is_drift_never_a_second_block(tmp_path, mode):
    pkg, ps = with_insert(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    c = pkg / "c.py"
    c.write_text(c.read_text().replace("    ok = ok and not y\n", "    ok = (ok and not y)\n"))
    before = tree_hash(pkg)
    args = [] if mode == "apply" else [mode]
    r = patcher("--vllm-root", pkg, "--patch-set", ps, *args)
    if mode == "--revert":
        one_line_failure(r, 3, "I1 c.py", "patched text was changed", "cannot revert")
    else:
        one_line_failure(r, 3, "I1 c.py: the patched text was changed after it was applied")
    assert tree_hash(pkg) == before
    assert c.read_text().count("kimidflash:I1") == 1


def test_reformatted_replace_style_line_is_drift(setup):
    pkg, ps, _ = setup
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    b = pkg / "sub" / "b.py"
    b.write_text(b.read_text().replace("VALUE = 2  #", "VALUE = (2)  #"))
    before = tree_hash(pkg)
    one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", ps),
        3,
        "T2 sub/b.py: the patched text was changed",
        "1 of 2 patched regions verbatim",
    )
    assert tree_hash(pkg) == before


def test_duplicated_patched_block_is_drift(tmp_path):
    pkg, ps = with_insert(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    c = pkg / "c.py"
    lines = c.read_text().splitlines(True)
    c.write_text("".join(lines[:4] + lines[2:4] + lines[4:]))  # the two patched lines twice
    before = tree_hash(pkg)
    one_line_failure(patcher("--vllm-root", pkg, "--patch-set", ps), 3, "I1 c.py", "markers found: 2, the patch has 1")
    assert tree_hash(pkg) == before


def test_changed_patch_set_on_a_patched_tree_is_drift_and_the_old_set_still_reverts(tmp_path):
    pkg, ps = with_insert(tmp_path)
    pristine = tree_hash(pkg)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    patched = tree_hash(pkg)
    old_hash = engine.variant_hash("I1", INSERT["variants"][0])
    ps2 = write_insert_set(
        tmp_path / "v2", replace="    ok = x > 0\n    # kimidflash:I1 guard v2\n    ok = ok and y is None\n"
    )
    for args in ([], ["--check"], ["--revert"]):
        line = one_line_failure(
            patcher("--vllm-root", pkg, "--patch-set", ps2, *args),
            3,
            "I1 c.py: applied by another patch set",
            f"kimidflash:I1@{old_hash}",
        )
        assert "revert with the patch set that applied it" in line
        assert tree_hash(pkg) == patched
    assert (pkg / "c.py").read_text().count("kimidflash:I1") == 1
    # A change that leaves the patched code alone keeps the patch applied.
    rep = tmp_path / "r.json"
    r = patcher("--vllm-root", pkg, "--patch-set", write_insert_set(tmp_path / "v3", why="reworded"), "--json", rep)
    assert r.returncode == 0 and states(rep)["I1"] == "already-applied"
    assert tree_hash(pkg) == patched
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--revert").returncode == 0
    assert tree_hash(pkg) == pristine


def test_a_patch_added_to_the_set_applies_and_both_revert(tmp_path):
    pkg = make_tree(tmp_path)
    (pkg / "c.py").write_text(C_PY)
    pristine = tree_hash(pkg)
    assert patcher("--vllm-root", pkg, "--patch-set", write_patchset(tmp_path)).returncode == 0
    ps2 = write_insert_set(tmp_path / "v2")
    rep = tmp_path / "r.json"
    assert patcher("--vllm-root", pkg, "--patch-set", ps2, "--json", rep).returncode == 0
    assert states(rep)["I1"] == "applied" and states(rep)["T2"] == "already-applied"
    assert patcher("--vllm-root", pkg, "--patch-set", ps2, "--revert").returncode == 0
    assert tree_hash(pkg) == pristine


# ---------------------------------------------------------------- retired patches
RETIRED_T2 = [{"id": "T2", "what": "w2", "files": ["sub/b.py"], "why": "never ran on a shipped path"}]


def write_retiring_set(tmp_path: Path, retired=RETIRED_T2, keep=("T1", "T3", "T4")) -> Path:
    """A .py patch set (the only kind with RETIRED) that no longer ships T2."""
    d = tmp_path / "ps-retiring"
    d.mkdir(parents=True, exist_ok=True)
    (d / "helper_src.py").write_text("HELPER = 1\n")
    path = d / "set.py"
    path.write_text(f"PATCHES = {[p for p in PATCHES if p['id'] in keep]!r}\nRETIRED = {retired!r}\n")
    return path


@pytest.mark.parametrize("mode", ["apply", "--check", "--dry-run", "--revert"])
def test_a_retired_patchs_marker_left_by_an_older_set_is_drift(tmp_path, mode):
    """An older set patched T2 in; the newer set retired it: leaving its code in place
    unnoticed, or reverting only half the tree, would both be wrong."""
    pkg = make_tree(tmp_path)
    pristine = tree_hash(pkg)
    older = write_patchset(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", older).returncode == 0
    patched = tree_hash(pkg)
    args = [] if mode == "apply" else [mode]
    line = one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", write_retiring_set(tmp_path), *args),
        3,
        "drift: T2 sub/b.py: carries the marker kimidflash:T2 of a patch this patch set retired",
    )
    assert "revert with that patch set, or start from an unmodified vLLM" in line
    assert tree_hash(pkg) == patched
    assert patcher("--vllm-root", pkg, "--patch-set", older, "--revert").returncode == 0
    assert tree_hash(pkg) == pristine


def test_a_retiring_set_patches_an_unmodified_tree_and_reverts_it(tmp_path):
    pkg = make_tree(tmp_path)
    pristine = tree_hash(pkg)
    rep = tmp_path / "r.json"
    ps = write_retiring_set(tmp_path)
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--json", rep).returncode == 0
    assert states(rep) == {"T1": "applied", "T3": "applied", "T4": "not-applicable"}
    assert "kimidflash" not in (pkg / "sub" / "b.py").read_text()
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--revert").returncode == 0
    assert tree_hash(pkg) == pristine


@pytest.mark.parametrize(
    "retired, culprit",
    [
        (
            [{"id": "T1", "what": "w", "files": ["a.py"], "why": "y"}],
            "retired patch 'T1': the id is also a shipped patch",
        ),
        ([{"id": "T2", "what": "w", "files": ["sub/b.py"]}], "needs 'id', 'files', 'what' and 'why'"),
        ([{"id": "T2", "what": "w", "files": "sub/b.py", "why": "y"}], "files must be a list of paths"),
        (RETIRED_T2 * 2, "retired patch 'T2': the id is retired twice"),
    ],
)
def test_retired_entries_are_validated(tmp_path, retired, culprit):
    pkg = make_tree(tmp_path)
    before = tree_hash(pkg)
    one_line_failure(patcher("--vllm-root", pkg, "--patch-set", write_retiring_set(tmp_path, retired)), 2, culprit)
    assert tree_hash(pkg) == before


# ---------------------------------------------------------------- modified before the first run
def _stamped(pid: str) -> dict:
    p = next(p for p in PATCHES + [INSERT] if p["id"] == pid)
    return dict(engine.stamped_edits(pid, p["variants"][0]))


@pytest.mark.parametrize("case", ["stamped copy", "bare marker", "partial", "foreign marker"])
def test_file_modified_before_the_first_run_is_refused(tmp_path, case):
    pkg = make_tree(tmp_path)
    b = pkg / "sub" / "b.py"
    t2 = _stamped("T2")
    if case == "stamped copy":  # exactly our patched text, but not written by us
        b.write_text("".join(t2.values()))
    elif case == "bare marker":  # an older patcher or a hand edit
        b.write_text("FLAG = True  # kimidflash:T2\nVALUE = 2  # kimidflash:T2\n")
    elif case == "partial":  # one edit of two
        b.write_text(t2["FLAG = False\n"] + "VALUE = 1\n")
    else:  # some other patch's marker in a file a patch is about to edit
        (pkg / "a.py").write_text("def f(x):\n    return x + 1  # ANCHOR_A\n# kimidflash:X9 local fix\n")
    ps = write_patchset(tmp_path)
    before = tree_hash(pkg)
    for args in ([], ["--check"], ["--revert"]):
        r = patcher("--vllm-root", pkg, "--patch-set", ps, *args)
        # nothing of the set is there to revert when only a foreign marker is
        want = 0 if (case, args) == ("foreign marker", ["--revert"]) else 3
        assert r.returncode == want and "Traceback" not in r.stderr, (args, r.stderr)
        assert tree_hash(pkg) == before
    r = patcher("--vllm-root", pkg, "--patch-set", ps)
    if case == "stamped copy":
        one_line_failure(r, 3, "T2 sub/b.py: modified before the patcher's first run", "kimidflash:T2@")
    elif case == "bare marker":
        one_line_failure(r, 3, "T2 sub/b.py: bare marker kimidflash:T2")
    elif case == "partial":
        one_line_failure(r, 3, "T2 sub/b.py", "1 of 2 patched regions verbatim")
    else:
        one_line_failure(r, 3, "T1 a.py: modified before the patcher's first run", "'kimidflash:X9'")


def test_installed_file_present_before_the_first_run_is_refused(setup):
    pkg, ps, _ = setup
    (pkg / "_helper.py").write_text("HELPER = 1\n")
    before = tree_hash(pkg)
    one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", ps), 3, "T1 _helper.py", "has no record of installing it"
    )
    one_line_failure(patcher("--vllm-root", pkg, "--patch-set", ps, "--revert"), 3, "T1 _helper.py")
    assert tree_hash(pkg) == before


def test_file_changed_outside_the_patched_regions_after_apply_is_refused(setup):
    pkg, ps, _ = setup
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    b = pkg / "sub" / "b.py"
    b.write_text(b.read_text() + "EXTRA = 1\n")  # markers intact, bytes not ours
    before = tree_hash(pkg)
    one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", ps), 3, "T2 sub/b.py: changed since the patcher wrote it"
    )
    one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", ps, "--revert"),
        3,
        "sub/b.py: reverting does not give the original bytes",
    )
    assert tree_hash(pkg) == before


def test_reinstalled_file_with_a_stale_manifest_is_patched_again(setup):
    """pip reinstalling vLLM over a patched tree puts the originals back but leaves the
    manifest: the originals match it, so the patches apply again and still revert."""
    pkg, ps, _ = setup
    pristine = tree_hash(pkg)
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    patched = tree_hash(pkg)
    (pkg / "sub" / "b.py").write_text("FLAG = False\nVALUE = 1\n")
    assert patcher("--vllm-root", pkg, "--patch-set", ps).returncode == 0
    assert tree_hash(pkg) == patched
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--revert").returncode == 0
    assert tree_hash(pkg) == pristine


def test_unreadable_manifest_is_refused(setup):
    pkg, ps, _ = setup
    (pkg / engine.MANIFEST).write_text("{not json")
    before = tree_hash(pkg)
    for args in ([], ["--revert"]):
        one_line_failure(
            patcher("--vllm-root", pkg, "--patch-set", ps, *args),
            3,
            f"vllm/{engine.MANIFEST}: not a manifest this patcher wrote",
        )
    assert tree_hash(pkg) == before


# ---------------------------------------------------------------- versions
@pytest.mark.parametrize(
    "version, why",
    [
        (NIGHTLY, "a development build"),
        ("1.5.0.dev3", "a development build"),
        ("1.5.0rc1", "a pre-release"),
        ("1.5.0+g1a2b3c", "a local build"),
        ("1.5.0+d20260421", "a local build"),
        ("1.5.0-custom build", "not a PEP 440 version"),
    ],
)
def test_non_release_version_is_refused_without_assume_version(tmp_path, version, why):
    pkg = make_tree(tmp_path, version=version)
    ps = write_patchset(tmp_path)
    before = tree_hash(pkg)
    for args in ([], ["--check"], ["--dry-run"]):
        r = patcher("--vllm-root", pkg, "--patch-set", ps, "--json", tmp_path / "r.json", *args)
        line = one_line_failure(
            r, 2, f"vLLM version {version!r}", why, "--assume-version X.Y.Z", ">=1.0.0,<2.0.0 or >=3.0.0,<4.0.0"
        )
        assert "not-applicable" not in r.stdout + line
        assert tree_hash(pkg) == before
        assert not (tmp_path / "r.json").exists()


def test_nightly_with_assume_version_applies_and_reverts_without_it(tmp_path):
    pkg = make_tree(tmp_path, version=NIGHTLY)
    ps = write_patchset(tmp_path)
    pristine = tree_hash(pkg)
    rep = tmp_path / "r.json"
    r = patcher("--vllm-root", pkg, "--patch-set", ps, "--assume-version", "1.5.0", "--json", rep)
    assert r.returncode == 0, r.stderr
    assert states(rep) == {"T1": "applied", "T2": "applied", "T3": "applied", "T4": "not-applicable"}
    report = json.loads(rep.read_text())
    assert (report["vllm_version"], report["vllm_version_installed"], report["version_source"]) == (
        "1.5.0",
        NIGHTLY,
        "--assume-version",
    )
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--assume-version", "1.5.0").returncode == 0
    assert tree_hash(pkg) != pristine
    assert patcher("--vllm-root", pkg, "--patch-set", ps, "--revert").returncode == 0  # no version needed
    assert tree_hash(pkg) == pristine


@pytest.mark.parametrize("bad", ["1.5", "1.5.0.dev1", "v1.5.0", "latest"])
def test_assume_version_must_be_a_release(setup, bad):
    pkg, ps, _ = setup
    before = tree_hash(pkg)
    one_line_failure(
        patcher("--vllm-root", pkg, "--patch-set", ps, "--assume-version", bad),
        2,
        "--assume-version",
        "give a release as X.Y.Z",
    )
    assert tree_hash(pkg) == before


@pytest.mark.parametrize(
    "version", ["1.5.0", "1.5", "v1.5.0", "1.5.0.post1", "1.5.0+rocm700", "1.5.0+cpu", "1.5.0+cu128", "1.5.0+rocm7.0.0"]
)
def test_releases_with_platform_tags_are_matched_by_their_numbers(tmp_path, version):
    assert engine.not_a_release(version) is None
    pkg = make_tree(tmp_path, version=version)
    rep = tmp_path / "r.json"
    assert patcher("--vllm-root", pkg, "--patch-set", write_patchset(tmp_path), "--json", rep).returncode == 0
    assert states(rep)["T1"] == "applied"


def test_shipped_patch_set_refuses_the_seeds_nightly_naming_its_ranges(tmp_path):
    pkg = make_tree(tmp_path, version=NIGHTLY)
    line = one_line_failure(patcher("--vllm-root", pkg, "--check"), 2, "a development build")
    assert "variants for >=0.20.0,<0.22.0 or >=0.32.0,<0.34.0)" in line


def test_docs_marker_example_is_the_shipped_p3_stamp():
    patches, _ = engine.load_patchset()
    p3 = next(p for p in patches if p["id"] == "P3")
    stamped = engine.stamped_marker("P3", p3["variants"][0])
    doc = (Path(engine.__file__).resolve().parents[1] / "docs" / "patches.md").read_text()
    assert f"`# {stamped} only the DFlash draft is non-causal`" in doc, stamped


def test_a_bug_is_one_line_exit_1_and_writes_nothing(setup, monkeypatch, capsys):
    pkg, ps, _ = setup
    before = tree_hash(pkg)

    def broken(*a, **k):
        raise KeyError("boom")

    monkeypatch.setattr(engine, "compile_staged", broken)
    assert engine.run(["--vllm-root", str(pkg), "--patch-set", str(ps)]) == engine.EXIT_INTERNAL == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["patch_dflash_rocm: internal error: KeyError: 'boom'"]
    assert tree_hash(pkg) == before
