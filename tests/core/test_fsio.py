"""fsio: the one way the package writes a file, publishes a folder and records provenance."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess

import pytest

from kimidflash import fsio


class Boom(Exception):
    pass


def test_open_atomic_publishes_only_a_whole_file(tmp_path):
    out = tmp_path / "sub" / "ckpt.pt"
    with fsio.open_atomic(out) as f:
        f.write(b"part one ")
        assert not out.exists()  # nothing visible while the writer streams
        f.write(b"part two")
    assert out.read_bytes() == b"part one part two"
    assert os.listdir(out.parent) == ["ckpt.pt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "result.json"
    fsio.write_json_atomic(out, {"v": 1})
    with pytest.raises(Boom), fsio.open_atomic(out) as f:
        f.write(b"half")
        raise Boom
    assert out.read_text() == '{\n  "v": 1\n}\n'
    assert os.listdir(tmp_path) == ["result.json"]


def test_written_files_get_the_umask_mode_not_mkstemps_0600(tmp_path):
    mask = os.umask(0o022)
    try:
        path = fsio.write_text_atomic(tmp_path / "r.txt", "x")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_atomic_dir_swaps_whole_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    with fsio.atomic_dir(out) as d:
        (d / "config.json").write_text("{}")
    with pytest.raises(Boom), fsio.atomic_dir(out) as d:
        (d / "other").write_text("new")
        raise Boom
    assert sorted(os.listdir(out)) == ["config.json"]
    with fsio.atomic_dir(out) as d:
        (d / "other").write_text("new")
    assert sorted(os.listdir(out)) == ["other"]
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    data = os.urandom((1 << 20) + 17)
    (tmp_path / "w").write_bytes(data)
    assert fsio.sha256_file(tmp_path / "w") == hashlib.sha256(data).hexdigest()


def test_utc_now_is_second_resolution_zulu():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", fsio.utc_now())


def test_git_info_in_and_outside_a_checkout(tmp_path):
    assert fsio.git_info(tmp_path) == {"revision": None, "dirty": None}
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "f").write_text("1")
    run("add", "f")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    info = fsio.git_info(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", info["revision"]) and info["dirty"] is False
    (tmp_path / "f").write_text("2")
    assert fsio.git_info(tmp_path)["dirty"] is True


def test_check_writable_probes_without_leaving_anything(tmp_path):
    out = tmp_path / "new" / "result.json"
    fsio.check_writable(out)
    assert out.parent.is_dir() and os.listdir(out.parent) == []
    with pytest.raises(IsADirectoryError):
        fsio.check_writable(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        fsio.check_writable(tmp_path / "file" / "result.json")
