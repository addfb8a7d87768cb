"""Committed results and manifests name no folder of the machine that made them.

Paths are recorded through kimidflash.paths.portable(): repo-relative,
`$KIMIDFLASH_CACHE/...`, `$TMPDIR/...` or `~/...`. The scan below reads every
committed JSON and Markdown file under drafters/ and benchmarks/.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

from kimidflash.bench.provenance import local_provenance, recipe_info
from kimidflash.paths import CONFIGS_DIR, REPO_ROOT, cache_dir, portable, portable_argv
from kimidflash.train.manifest import portable_config, portable_train

SCANNED_DIRS = ("drafters", "benchmarks")
SCANNED_SUFFIXES = (".json", ".md")
# Home and checkout folders of the usual machines, matched where a path starts
# (not `drafters/tmp/x`), then this checkout and this cache wherever they are.
MACHINE_PREFIXES = ("/root/", "/home/", "/Users/", "/work/", "/tmp/")


def machine_paths(path: Path) -> list[str]:
    """`line N: <path>` for every absolute home/checkout/cache path in the file."""
    needles = [re.escape(p) for p in MACHINE_PREFIXES]
    needles += [re.escape(str(p).rstrip("/")) + r"(?=/|\b)" for p in (REPO_ROOT, cache_dir()) if str(p) != "/"]
    pattern = re.compile(r"(?<![\w.~$-])(?:" + "|".join(needles) + r")[^\s\"'`()|,]*")
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        found += [f"line {n}: {m.group(0)}" for m in pattern.finditer(line)]
    return found


def committed_files() -> list[Path]:
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "ls-files", "-z", *SCANNED_DIRS], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git unavailable: {e}")
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.strip()}")
    return [REPO_ROOT / f for f in r.stdout.split("\0") if f.endswith(SCANNED_SUFFIXES)]


def test_committed_results_record_no_machine_paths():
    files = committed_files()
    assert any(f.suffix == ".json" for f in files), "no committed JSON under drafters/ or benchmarks/?"
    bad = {str(f.relative_to(REPO_ROOT)): hits for f in files if f.is_file() and (hits := machine_paths(f))}
    assert not bad, (
        "absolute paths of the building machine in committed files (record them through "
        "kimidflash.paths.portable):\n" + "\n".join(f"{f}: {h}" for f, hs in bad.items() for h in hs)
    )


def test_scan_finds_machine_paths(tmp_path):
    dirty = tmp_path / "r.json"
    dirty.write_text(
        json.dumps({"root": "/root/.cache/x", "command": f"{REPO_ROOT}/src/a.py --out /home/u/o"}, indent=1) + "\n"
    )
    hits = machine_paths(dirty)
    assert any("/root/.cache/x" in h for h in hits)
    assert any(f"{REPO_ROOT}/src/a.py" in h for h in hits)
    assert any("/home/u/o" in h for h in hits)
    md = tmp_path / "r.md"
    md.write_text("recipe /work/main/configs/cpu-tiny.env (sha256 x)\n`/tmp/kd/interim`\n")
    assert machine_paths(md) == ["line 1: /work/main/configs/cpu-tiny.env", "line 2: /tmp/kd/interim"]
    clean = tmp_path / "c.json"
    clean.write_text(
        json.dumps(
            {
                "a": "$KIMIDFLASH_CACHE/models/x",
                "b": "drafters/tmp/x",
                "c": "~/m",
                "d": "/models/Kimi-K2.6",
                "e": "$TMPDIR/kd/interim",
                "f": "configs/x.env",
            }
        )
    )
    assert machine_paths(clean) == []


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """A cache, a home and a temp folder of our own (all under tmp_path, itself maybe under /tmp or ~)."""
    d = {k: tmp_path / k for k in ("cache", "home", "tmp", "downloads")}
    monkeypatch.setenv("KIMIDFLASH_CACHE", str(d["cache"]))
    monkeypatch.setenv("KIMIDFLASH_DOWNLOADS", str(d["downloads"]))
    monkeypatch.setenv("HOME", str(d["home"]))
    monkeypatch.setattr(tempfile, "tempdir", str(d["tmp"]))
    return d


def test_portable_repo_paths_become_relative(dirs):
    assert portable(REPO_ROOT / "drafters" / "x") == "drafters/x"
    assert portable(f"{REPO_ROOT}/configs/../drafters/x") == "drafters/x"
    assert portable(str(REPO_ROOT / "configs" / "cpu-tiny.env")) == "configs/cpu-tiny.env"
    assert portable(REPO_ROOT) == "."


def test_portable_cache_home_temp_and_other(dirs):
    assert portable(dirs["cache"] / "models" / "tiny-qwen3") == "$KIMIDFLASH_CACHE/models/tiny-qwen3"
    assert portable(dirs["cache"]) == "$KIMIDFLASH_CACHE"
    assert portable(dirs["downloads"] / "w.whl") == "$KIMIDFLASH_DOWNLOADS/w.whl"
    assert portable(dirs["home"] / "models" / "m") == "~/models/m"
    assert portable(str(dirs["tmp"]) + "/kd/../kd/interim") == "$TMPDIR/kd/interim"
    # A user's configured location and relative paths stay as given.
    assert portable("/models/Kimi-K2.6") == "/models/Kimi-K2.6"
    assert portable("configs/../x") == "configs/../x"
    assert portable("synthetic:2800") == "synthetic:2800"


def test_portable_cache_inside_home_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KIMIDFLASH_CACHE", str(tmp_path / ".cache" / "kimidflash"))
    assert portable(tmp_path / ".cache" / "kimidflash" / "m") == "$KIMIDFLASH_CACHE/m"
    assert portable(tmp_path / ".cache" / "other") == "~/.cache/other"


def test_portable_argv(dirs):
    cmd = shlex.join(
        [
            str(REPO_ROOT / "src/kimidflash/train/ab.py"),
            "configs/cpu-tiny.env",
            "--drafter",
            f"random-dflash={dirs['cache']}/models/tiny-qwen3-dflash",
            "--api-key",
            "***",
            "--label",
            "a b",
            "--out",
            f"{dirs['home']}/out",
            "--k",
            "3",
        ]
    )
    out = portable_argv(cmd)
    assert out == (
        "src/kimidflash/train/ab.py configs/cpu-tiny.env --drafter "
        "random-dflash=$KIMIDFLASH_CACHE/models/tiny-qwen3-dflash --api-key '***' --label 'a b' "
        "--out ~/out --k 3"
    )
    assert portable_argv(
        [
            "./train-drafter.sh",
            f"{REPO_ROOT}/configs/train-overfit-gate.json",
            "--run-dir",
            f"{dirs['tmp']}/run",
            "--set",
            f"export.out={dirs['tmp']}/drafter",
            "--set",
            "train.steps=5",
            "export",
        ]
    ) == [
        "./train-drafter.sh",
        "configs/train-overfit-gate.json",
        "--run-dir",
        "$TMPDIR/run",
        "--set",
        "export.out=$TMPDIR/drafter",
        "--set",
        "train.steps=5",
        "export",
    ]
    # Words that are not rewritten keep shlex's quoting.
    assert portable_argv("x --prompt 'it'\"'\"'s' --ok") == "x --prompt 'it'\"'\"'s' --ok"


def test_provenance_records_portable_paths(dirs):
    draft = dirs["cache"] / "models" / "d"
    rec = recipe_info(str(CONFIGS_DIR / ".." / "configs" / "cpu-tiny.env"), {"DRAFT_MODEL_DIR": str(draft)})
    assert rec["path"] == "configs/cpu-tiny.env" and rec["files"][0] == "configs/cpu-tiny.env"
    assert rec["overrides"]["DRAFT_MODEL_DIR"] == rec["values"]["DRAFT_MODEL_DIR"] == "$KIMIDFLASH_CACHE/models/d"
    prov = local_provenance(
        [
            str(REPO_ROOT / "src/kimidflash/bench/cli.py"),
            "--api-key",
            "s3cret",
            "--output",
            str(dirs["home"] / "r.json"),
        ]
    )
    assert prov["command"] == "src/kimidflash/bench/cli.py --api-key '***' --output ~/r.json"


def test_manifest_config_is_portable(dirs):
    cfg = {
        "name": "n",
        "run_dir": str(dirs["cache"] / "train-runs" / "n"),
        "_path": "/x/t.json",
        "target": {"serve_config": str(CONFIGS_DIR / "cpu-reference.env"), "serve_overrides": [], "model_dir": None},
        "drafter_config": f"{CONFIGS_DIR}/../configs/smollm2-dflash-draft.json",
        "data": {"prompts": str(dirs["home"] / "p.jsonl")},
        "export": {"out": str(REPO_ROOT / "drafters" / "n"), "dtype": "bfloat16"},
    }
    out = portable_config(cfg)
    assert "_path" not in out and cfg["run_dir"].startswith("/")  # the config in use keeps its absolute paths
    assert out["run_dir"] == "$KIMIDFLASH_CACHE/train-runs/n"
    assert out["target"] == {"serve_config": "configs/cpu-reference.env", "serve_overrides": [], "model_dir": None}
    assert out["drafter_config"] == "configs/smollm2-dflash-draft.json"
    assert out["data"]["prompts"] == "~/p.jsonl"
    assert out["export"] == {"out": "drafters/n", "dtype": "bfloat16"}


def test_train_section_records_the_start_drafter_portably(dirs):
    from kimidflash.train.config import TrainOptions

    tc = TrainOptions.coerce({"init_from_drafter": str(dirs["cache"] / "drafters" / "v4")})
    assert portable_train(tc)["init_from_drafter"] == "$KIMIDFLASH_CACHE/drafters/v4"
    assert tc.init_from_drafter.startswith("/")  # the options in use keep the path they open
