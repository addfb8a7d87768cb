"""serve's phases without a server: the checkpoint rules run once, after prepare."""

from __future__ import annotations

import json

import pytest

from kimidflash import serve as serve_mod
from kimidflash import serve_cli
from kimidflash.config import ConfigError, load_config, loader
from kimidflash.errors import BuildFailed, ContainerError, CpuBaseError, EngineUnavailable, RecipeError

from ..support.helpers import CONFIGS, write_env


def test_checkpoints_prepare_makes_are_checked_before_preflight(tmp_path, monkeypatch):
    draft = tmp_path / "draft"
    config = load_config(
        write_env(
            tmp_path / "c.env",
            f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nDRAFT_MODEL_DIR={draft}\nNUM_SPECULATIVE_TOKENS=5\n",
        ),
        environ={},
    )
    made: list[str] = []

    def fake_prepare(cfg, log):  # a drafter whose block size the config exceeds appears only now
        draft.mkdir()
        (draft / "config.json").write_text(json.dumps({"block_size": 4}))
        made.append(cfg.draft_model_dir)

    monkeypatch.setattr(serve_mod, "prepare", fake_prepare)
    monkeypatch.setattr(serve_mod, "preflight", lambda *a, **k: pytest.fail("preflight ran after a refusal"))
    with pytest.raises(ConfigError, match=r"outside 1\.\.4"):
        serve_mod.serve(config)
    assert made == [str(draft)]


def test_environment_errors_are_recipe_errors_and_build_failures_are_not():
    for cls in (EngineUnavailable, ContainerError):
        assert issubclass(cls, RecipeError) and issubclass(cls, RuntimeError)
    for cls in (BuildFailed, CpuBaseError):
        assert not issubclass(cls, RecipeError) and issubclass(cls, RuntimeError)


@pytest.mark.parametrize("dry_run", [True, False])
def test_each_rule_pass_runs_once_on_the_serve_path(tmp_path, monkeypatch, dry_run):
    """`serve` loads with the value rules, then checks the checkpoints once: after
    prepare, or as they are for a dry run (nothing is prepared)."""
    env = write_env(tmp_path / "c.env", f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\n")
    passes: list[str] = []
    monkeypatch.setattr(loader, "check_config", lambda c: passes.append("config"))
    monkeypatch.setattr(loader, "check_checkpoints", lambda c: passes.append("checkpoints"))
    monkeypatch.setattr(serve_mod, "check_checkpoints", lambda c: passes.append("checkpoints"))
    monkeypatch.setattr(serve_mod, "prepare", lambda cfg, log: passes.append("prepare"))
    monkeypatch.setattr(serve_mod, "run_preflight", lambda *a: False)  # stop before starting a server
    rc = serve_cli.main([str(env), "--quiet"] + (["--dry-run"] if dry_run else []))
    assert passes == (["config", "checkpoints"] if dry_run else ["config", "prepare", "checkpoints"])
    assert rc == (0 if dry_run else 1)


def test_preflight_only_checks_the_host_and_starts_nothing(tmp_path, monkeypatch, capsys):
    """The operator's first step: a ROCm config on a host with no GPUs and no models
    fails with every check's fix; nothing is prepared or started."""
    env = write_env(
        tmp_path / "c.env",
        f"INCLUDE={CONFIGS / 'production.env'}\nMODEL_DIR={tmp_path / 'none'}\n"
        f"DRAFT_MODEL_DIR={tmp_path / 'none-draft'}\n",
    )
    monkeypatch.setattr(serve_mod, "prepare", lambda *a, **k: pytest.fail("prepare ran"))
    monkeypatch.setattr(serve_mod, "LocalServer", lambda *a, **k: pytest.fail("a server started"))
    (tmp_path / "dev").mkdir()
    config = load_config(env, environ={})
    rc = serve_mod.serve(config, preflight_only=True, proc_root=tmp_path / "proc", dev_root=tmp_path / "dev")
    err = capsys.readouterr().err
    assert rc == 1
    for words in ("/dev/kfd", "0 render nodes for TENSOR_PARALLEL_SIZE=8", "MODEL_DIR", "download the checkpoint"):
        assert words in err, words
    assert (
        serve_cli.main(
            [
                str(env),
                "--preflight-only",
                "--set",
                "PLATFORM=cpu",
                "--set",
                "MOE_BACKEND=auto",
                "--set",
                "TENSOR_PARALLEL_SIZE=1",
                "--set",
                "VLLM_VERSION=0.32.0",
            ]
        )
        == 1
    )  # models missing


def test_prepare_only_makes_what_the_runtime_needs_checks_it_and_starts_nothing(tmp_path, monkeypatch, capsys):
    """CI warms its caches with it, and an operator can run it as a build step: prepare, then the
    checkpoint rules on what prepare made, and exit 0 without preflight or a server."""
    env = write_env(tmp_path / "c.env", f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\n")
    passes: list[str] = []
    monkeypatch.setattr(serve_mod, "prepare", lambda cfg, log: passes.append("prepare"))
    monkeypatch.setattr(serve_mod, "check_checkpoints", lambda c: passes.append("checkpoints"))
    monkeypatch.setattr(serve_mod, "run_preflight", lambda *a: pytest.fail("preflight ran"))
    monkeypatch.setattr(serve_mod, "LocalServer", lambda *a, **k: pytest.fail("a server started"))
    assert serve_cli.main([str(env), "--prepare-only"]) == 0
    assert passes == ["prepare", "checkpoints"]
    assert "nothing started" in capsys.readouterr().err
