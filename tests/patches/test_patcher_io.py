"""Fast tier: the patcher's I/O failures as a user the permission bits bind (nobody when the
tests run as root): a read-only package, an unreadable file, an unwritable report and a write
failing midway are one-line I/O errors, and the tree is left byte-identical or put back."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.patches.test_patcher import PATCHER, engine, make_tree, states, write_patchset
from tests.patches.test_patcher_adversarial import one_line_failure, tree_hash

NOBODY = 65534


def _drop_to_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.fixture
def unprivileged(tmp_path):
    """(run, base): run(*args) runs the patcher as a user that the permission bits bind
    (nobody when the tests run as root), base is a directory that user can reach."""
    base = Path(tempfile.mkdtemp(prefix="kimidflash-ro-"))
    os.chmod(base, 0o755)
    shutil.copy(PATCHER, base / "patch_dflash_rocm.py")
    shutil.copytree(PATCHER.parent / "patchengine", base / "patchengine", ignore=shutil.ignore_patterns("__pycache__"))
    as_root = os.geteuid() == 0
    preexec = _drop_to_nobody if as_root else None
    python = None
    for cand in dict.fromkeys([sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]):
        if not cand:
            continue
        try:
            ok = subprocess.run(
                [cand, "-c", f"import os, sys; assert sys.version_info >= (3, 9); os.listdir({str(base)!r})"],
                preexec_fn=preexec,
                capture_output=True,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if ok.returncode == 0:
            python = cand
            break
    if python is None:
        shutil.rmtree(base)
        pytest.skip(
            "no Python 3.9+ that user nobody can run and no way for it to reach the temporary directory"
            if as_root
            else "no Python 3.9+ found"
        )

    def run(*args):
        return subprocess.run(
            [python, str(base / "patch_dflash_rocm.py"), *map(str, args)],
            capture_output=True,
            text=True,
            preexec_fn=preexec,
            cwd=str(base),
        )

    run.as_root = as_root
    try:
        yield run, base
    finally:
        for p in [base, *base.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, 0o755)
        shutil.rmtree(base)


def _readonly(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)


def _world_readable_setup(base: Path):
    pkg = make_tree(base)
    ps = write_patchset(base)
    for p in [base, *base.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return pkg, ps


def test_read_only_package_is_an_io_error_and_leaves_the_tree(unprivileged):
    run, base = unprivileged
    pkg, ps = _world_readable_setup(base)
    _readonly(pkg)
    before = tree_hash(pkg)
    line = one_line_failure(
        run("--vllm-root", pkg, "--patch-set", ps),
        engine.EXIT_IO,
        "I/O error: cannot write vllm/",
        "Permission denied",
        "nothing was changed",
    )
    assert engine.EXIT_IO == 6, line
    assert tree_hash(pkg) == before
    # --check and --dry-run write nothing and still work there.
    assert run("--vllm-root", pkg, "--patch-set", ps, "--check").returncode == 4
    assert run("--vllm-root", pkg, "--patch-set", ps, "--dry-run").returncode == 0
    assert tree_hash(pkg) == before


def test_write_failing_midway_puts_back_what_was_written(unprivileged):
    """The manifest, the helper and a.py are written, then sub/ refuses b.py: all of it
    is undone."""
    run, base = unprivileged
    pkg, ps = _world_readable_setup(base)
    if run.as_root:
        for p in [pkg, *pkg.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)
    os.chmod(pkg / "sub", 0o555)
    before = tree_hash(pkg)
    one_line_failure(run("--vllm-root", pkg, "--patch-set", ps), 6, "cannot write vllm/sub/b.py", "nothing was changed")
    assert tree_hash(pkg) == before
    assert not (pkg / engine.MANIFEST).exists() and not (pkg / "_helper.py").exists()


def test_unreadable_file_and_unwritable_report_are_io_errors(unprivileged):
    run, base = unprivileged
    pkg, ps = _world_readable_setup(base)
    if run.as_root:
        for p in [pkg, *pkg.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)
    os.chmod(pkg / "a.py", 0)
    before = tree_hash(pkg)
    one_line_failure(run("--vllm-root", pkg, "--patch-set", ps), 6, "cannot read vllm/a.py", "Permission denied")
    assert tree_hash(pkg) == before
    os.chmod(pkg / "a.py", stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    reports = base / "reports"
    reports.mkdir(mode=0o555)
    os.chmod(reports, 0o555)
    before = tree_hash(pkg)
    one_line_failure(
        run("--vllm-root", pkg, "--patch-set", ps, "--json", reports / "r.json"),
        6,
        f"cannot write the report {reports / 'r.json'}",
        "nothing was changed",
    )
    assert tree_hash(pkg) == before and not (reports / "r.json").exists()
    # With a report it can write, the same run succeeds.
    out = base / "out"
    out.mkdir()
    if run.as_root:
        os.chown(out, NOBODY, NOBODY)
    assert run("--vllm-root", pkg, "--patch-set", ps, "--json", out / "r.json").returncode == 0
    assert states(out / "r.json")["T1"] == "applied"
