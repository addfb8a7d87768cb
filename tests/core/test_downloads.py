"""Content-addressed downloads: a kept file is used only if its sha256 matches."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from kimidflash import downloads


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KIMIDFLASH_DOWNLOADS", str(tmp_path))
    return tmp_path / "wheels"


def _pip_writes(monkeypatch, content: bytes) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(cmd, check):
        calls.append([*cmd, Path(cmd[cmd.index("-r") + 1]).read_text().strip()])  # the pinned requirement
        Path(cmd[cmd.index("-d") + 1], "pkg-1.0-py3-none-any.whl").write_bytes(content)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(downloads.subprocess, "run", fake_run)
    return calls


def test_a_kept_file_with_the_right_digest_is_used_without_pip(folder, monkeypatch):
    folder.mkdir()
    (folder / "pkg-1.0-py3-none-any.whl").write_bytes(b"good")
    calls = _pip_writes(monkeypatch, b"never")
    path = downloads.pypi_wheel("pkg==1.0", "pkg-1.0-py3-none-any.whl", hashlib.sha256(b"good").hexdigest())
    assert path.read_bytes() == b"good" and calls == []


def test_a_kept_file_with_another_digest_is_fetched_again(folder, monkeypatch):
    folder.mkdir()
    (folder / "pkg-1.0-py3-none-any.whl").write_bytes(b"truncat")
    calls = _pip_writes(monkeypatch, b"good")
    path = downloads.pypi_wheel("pkg==1.0", "pkg-1.0-py3-none-any.whl", hashlib.sha256(b"good").hexdigest())
    assert path.read_bytes() == b"good"
    assert len(calls) == 1 and calls[0][-1] == f"pkg==1.0 --hash=sha256:{hashlib.sha256(b'good').hexdigest()}"
    assert "--require-hashes" in calls[0] and "--only-binary=:all:" in calls[0]


def test_a_download_with_the_wrong_digest_is_refused_and_not_kept(folder, monkeypatch):
    _pip_writes(monkeypatch, b"evil")
    with pytest.raises(downloads.DownloadError, match="pkg-1.0-py3-none-any.whl: sha256"):
        downloads.pypi_wheel("pkg==1.0", "pkg-1.0-py3-none-any.whl", hashlib.sha256(b"good").hexdigest())
    assert not (folder / "pkg-1.0-py3-none-any.whl").exists()
