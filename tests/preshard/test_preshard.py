"""Pre-sharding without vLLM: the manifest and its checks, the refusals before any
work (overwrite, disk space, bad source), the all-or-nothing output folder, and
the config key's rendering, mount and preflight. The saver itself runs in
test_preshard_slow.py against real vLLM."""

from __future__ import annotations

import dataclasses
import json
from collections import namedtuple
from pathlib import Path

import pytest

from kimidflash import cli
from kimidflash.config import load_config
from kimidflash.docker.spec import mounts
from kimidflash.errors import PreshardError
from kimidflash.preflight import check_presharded
from kimidflash.preshard import cli as preshard_cli
from kimidflash.preshard import manifest
from kimidflash.render import render

from ..support.helpers import CONFIGS, write_env

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}))
    (d / "tokenizer.json").write_text("{}")
    (d / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 1000)
    return d


@pytest.fixture
def config(tmp_path: Path, src: Path):
    env = write_env(
        tmp_path / "c.env",
        f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nMODEL_DIR={src}\nPREPARE_MODELS=none\n"
        "SPECULATIVE_METHOD=none\nDTYPE=float32\n",
    )
    return load_config(env)


def fake_saver(tp: int = 1, fail_after_writing: bool = False):
    def run(config, src, tmp, max_shard_bytes):
        for rank in range(tp):
            (tmp / f"model-rank-{rank}-part-0.safetensors").write_bytes(b"x" * (100 + rank))
        (tmp / "config.json").write_text((src / "config.json").read_text())
        if fail_after_writing:
            raise PreshardError("the saver failed (exit 1); its last lines:\n  boom")
        return "0.32.0"

    return run


def test_a_run_writes_shards_and_a_manifest_that_verifies(tmp_path, src, config, monkeypatch):
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver())
    monkeypatch.setattr(preshard_cli, "prepare", lambda cfg: None)
    out = tmp_path / "sharded"
    doc = preshard_cli.preshard(config, out)
    assert (out / manifest.MANIFEST).is_file() and doc["tensor_parallel_size"] == 1 and doc["vllm_version"] == "0.32.0"
    assert [f["name"] for f in doc["files"]] == ["config.json", "model-rank-0-part-0.safetensors"]
    assert doc["source"]["files"] == 3 and "config.json" in doc["source"]["metadata_sha256"]
    assert manifest.problems(out, tensor_parallel_size=1, vllm_version="0.32.0", hashes=True) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sharded")]  # no temporary left


def test_the_manifest_explains_every_mismatch(tmp_path, src, config, monkeypatch):
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver(tp=2))
    monkeypatch.setattr(preshard_cli, "prepare", lambda cfg: None)
    out = tmp_path / "sharded"
    preshard_cli.preshard(dataclasses.replace(config, tensor_parallel_size=2), out)
    assert manifest.problems(out, tensor_parallel_size=2, vllm_version="0.32.0") == []
    bad = manifest.problems(out, tensor_parallel_size=8, vllm_version="0.33.0")
    assert any("pre-sharded for TENSOR_PARALLEL_SIZE=2, the config serves 8" in b for b in bad)
    assert any("pre-sharded by vLLM 0.32.0, the config pins 0.33.0" in b for b in bad)
    shard = out / "model-rank-1-part-0.safetensors"
    shard.write_bytes(b"x" * 5)
    assert manifest.problems(out, tensor_parallel_size=2, vllm_version="0.32.0") == [
        "model-rank-1-part-0.safetensors is 5 bytes, the manifest says 101 (truncated or replaced)"
    ]
    shard.write_bytes(b"y" * 101)  # same size, other bytes: only the hashes see it
    assert manifest.problems(out, tensor_parallel_size=2, vllm_version="0.32.0") == []
    assert manifest.problems(out, tensor_parallel_size=2, vllm_version="0.32.0", hashes=True) == [
        "model-rank-1-part-0.safetensors does not match its sha256 in the manifest"
    ]
    shard.unlink()
    assert "model-rank-1-part-0.safetensors is missing" in manifest.problems(
        out, tensor_parallel_size=2, vllm_version="0.32.0"
    )
    (out / manifest.MANIFEST).unlink()
    assert (
        "was not made by `kimidflash preshard`"
        in manifest.problems(out, tensor_parallel_size=2, vllm_version="0.32.0")[0]
    )


def test_a_failed_saver_leaves_no_output_and_an_old_one_untouched(tmp_path, src, config, monkeypatch):
    monkeypatch.setattr(preshard_cli, "prepare", lambda cfg: None)
    out = tmp_path / "sharded"
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver(fail_after_writing=True))
    with pytest.raises(PreshardError, match="the saver failed"):
        preshard_cli.preshard(config, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.env", "model"]  # no output, no temporary
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver())
    preshard_cli.preshard(config, out)
    before = (out / manifest.MANIFEST).read_bytes()
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver(fail_after_writing=True))
    with pytest.raises(PreshardError):
        preshard_cli.preshard(config, out, force=True)
    assert (out / manifest.MANIFEST).read_bytes() == before


def test_refusals_before_any_work(tmp_path, src, config, monkeypatch, capsys):
    out = tmp_path / "sharded"
    out.mkdir()
    argv = ["preshard", str(config.path), "--out", str(out)]
    assert cli.main(argv) == 2
    assert "exists; pass --force to replace it" in capsys.readouterr().err
    monkeypatch.setattr(preshard_cli.shutil, "disk_usage", lambda p: Usage(10**12, 10**12, 100))
    assert cli.main([*argv, "--force"]) == 2
    # 1000 bytes of bfloat16 weights served as float32: twice that, plus 10%
    assert "needs about 0.0 GiB (its weights at DTYPE=float32, plus 10%)" in capsys.readouterr().err
    assert preshard_cli.needed_bytes(src, "float32") == 2200 and preshard_cli.needed_bytes(src, "bfloat16") == 1100
    assert cli.main(["preshard", str(config.path), "--out", str(src / "inner")]) == 2
    assert "is inside MODEL_DIR" in capsys.readouterr().err
    (src / "model-00001-of-00001.safetensors").unlink()
    assert cli.main(["preshard", str(config.path), "--out", str(tmp_path / "x")]) == 2
    assert "holds no *.safetensors weights" in capsys.readouterr().err


def test_the_config_key_renders_the_shards_mounts_them_and_preflight_reads_the_manifest(
    tmp_path, src, config, monkeypatch
):
    monkeypatch.setattr(preshard_cli, "run_saver", fake_saver())
    monkeypatch.setattr(preshard_cli, "prepare", lambda cfg: None)
    out = tmp_path / "sharded"
    preshard_cli.preshard(config, out)
    served = load_config(config.path, {"PRESHARDED_DIR": str(out)})
    argv = render(served).argv
    assert argv[argv.index("--model") + 1] == str(out) and argv[argv.index("--load-format") + 1] == "sharded_state"
    assert "--load-format" not in render(config).argv
    assert mounts(served)[str(out)] == {"bind": str(out), "mode": "ro"}
    [ok] = check_presharded(served)
    assert ok.ok and "manifest matches TP 1, vLLM 0.32.0" in ok.detail
    [bad] = check_presharded(load_config(config.path, {"PRESHARDED_DIR": str(out), "VLLM_VERSION": "0.33.0"}))
    assert not bad.ok and "the config pins 0.33.0" in bad.detail and "--force" in bad.fix
    assert check_presharded(config) == []


def test_load_time_figures_are_read_from_vllms_own_log_lines():
    from kimidflash.preshard.loadtime import FIGURES

    log = (
        "(Worker pid=1) INFO 11-24 06:39:53 [default_loader.py:501] Loading weights took 1.18 seconds\n"
        "INFO [gpu_model_runner.py:5150] Model loading took 2.7 GiB memory and 3.456789 seconds\n"
    )
    assert [float(FIGURES[k].findall(log)[0]) for k in ("weights_load_s", "model_load_s")] == [1.18, 3.456789]
