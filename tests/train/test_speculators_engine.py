"""The speculators engine's train phase without running speculators: its refusals, and the command
it gives torchrun on a GPU node (what this machine cannot run, checked as a command line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimidflash.errors import TrainConfigError
from kimidflash.train import config as tcfg
from kimidflash.train.speculators import engine

from ..support.helpers import CONFIGS

TINY = CONFIGS / "train-kimi-tiny-speculators.json"


@pytest.fixture
def ran(monkeypatch, tmp_path):
    """run_logged and the venv faked: the argv each call would have run."""
    calls: list[list[str]] = []
    venv = tmp_path / "venv" / "bin"
    monkeypatch.setattr("kimidflash.train.speculators.cli.ensure_speculators", lambda: venv / "speculators")
    monkeypatch.setattr(engine, "run_logged", lambda argv, *a, **k: calls.append(list(argv)))
    return calls


def _captured(run: Path) -> None:
    (run / "speculators").mkdir(parents=True)
    (run / "speculators" / "captured.txt").write_text("done\n")


def test_on_a_gpu_node_it_runs_torchrun_with_fsdp_and_our_options(ran, tmp_path):
    cfg = tcfg.load(
        TINY,
        {
            "speculators.dry_run": False,
            "cluster.gpus_per_node": 8,
            "cluster.gpu_memory_gb": 192,
            "train.lr": 3e-4,
            "train.gamma": 7.0,
        },
    )
    run = tmp_path / "run"
    _captured(run)
    save = engine.train_speculators(cfg, run, resume=False, max_steps=None, log=lambda _: None)
    (argv,) = ran
    assert argv[:4] == [str(tmp_path / "venv" / "bin" / "torchrun"), "--nnodes=1", "--nproc-per-node=8", "-m"]
    assert argv[4] == "speculators.train"
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert "--fsdp-shard" in argv and "--dry-run" not in argv
    assert flag["--lr"] == "0.0003" and flag["--dflash-decay-gamma"] == "7.0" and flag["--optimizer"] == "adamw"
    assert flag["--max-steps"] == str(cfg.train.steps) and flag["--on-missing"] == "raise"
    assert flag["--save-path"] == str(save) == str(run / "speculators" / "checkpoints")
    shape = cfg.shape()
    assert argv[argv.index("--target-layer-ids") + 1 :][: len(shape.target_layer_ids)] == [
        str(i + 1) for i in shape.target_layer_ids
    ]
    drafted = json.loads(Path(flag["--draft-config"]).read_text())
    assert (drafted["num_hidden_layers"], drafted["hidden_size"]) == (shape.num_hidden_layers, shape.hidden_size)
    note = json.loads((run / "manifest.json").read_text())["train"]
    assert note["engine"] == "speculators" and note["dry_run"] is False


def test_across_nodes_it_needs_the_rendezvous_endpoint(ran, tmp_path, monkeypatch):
    cfg = tcfg.load(TINY, {"speculators.dry_run": False, "cluster.gpus_per_node": 8, "cluster.nodes": 2})
    run = tmp_path / "run"
    _captured(run)
    monkeypatch.delenv(engine.RDZV_ENV, raising=False)
    with pytest.raises(TrainConfigError, match=engine.RDZV_ENV):
        engine.train_speculators(cfg, run, resume=False, max_steps=None, log=lambda _: None)
    monkeypatch.setenv(engine.RDZV_ENV, "node0:29500")
    engine.train_speculators(cfg, run, resume=False, max_steps=None, log=lambda _: None)
    assert ran[0][1:4] == ["--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500", "--nnodes=2"]


def test_without_a_gpu_only_a_dry_run_is_accepted(ran, tmp_path):
    cfg = tcfg.load(TINY, {"speculators.dry_run": False})
    with pytest.raises(TrainConfigError, match="speculators.dry_run=true"):
        engine.train_speculators(cfg, tmp_path / "run", resume=False, max_steps=None, log=lambda _: None)
    assert ran == []
    engine.train_speculators(tcfg.load(TINY), tmp_path / "run", resume=False, max_steps=None, log=lambda _: None)
    assert ran[0][1] == "train" and "--dry-run" in ran[0]


def test_training_needs_a_finished_capture_and_does_not_start_over_a_run_without_resume(ran, tmp_path):
    cfg = tcfg.load(TINY, {"speculators.dry_run": False, "cluster.gpus_per_node": 1})
    run = tmp_path / "run"
    with pytest.raises(TrainConfigError, match="run the capture phase"):
        engine.train_speculators(cfg, run, resume=False, max_steps=None, log=lambda _: None)
    _captured(run)
    (run / "speculators" / "checkpoints" / "0").mkdir(parents=True)
    with pytest.raises(TrainConfigError, match="--resume continues it"):
        engine.train_speculators(cfg, run, resume=False, max_steps=None, log=lambda _: None)
    assert ran == []
    engine.train_speculators(cfg, run, resume=True, max_steps=5, log=lambda _: None)
    assert "--no-resume-from-checkpoint" not in ran[0] and ran[0][ran[0].index("--max-steps") + 1] == "5"
