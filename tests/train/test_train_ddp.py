"""`torchrun` data-parallel training on CPU (gloo): what the Kimi run does on 8 GPUs, at toy size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kimidflash.train.trainer import train_loop

from ..support.helpers import ROOT
from .test_train_model import SHAPE, TRAIN, FakeStore, head

pytestmark = pytest.mark.slow


def test_two_ranks_draw_different_batches_and_end_with_identical_weights(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--standalone",
            "-m",
            "tests.support.ddp_worker",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1))
    assert r0["step"] == r1["step"] == TRAIN["steps"]
    assert r0["first_loss"] != r1["first_loss"], "both ranks trained on the same batch"
    assert r0["fc"] == r1["fc"] and r0["checksum"] == r1["checksum"], "DDP left the ranks' weights apart"
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == TRAIN["steps"] and len(ckpt["rng"]["data"]) == 2  # rank 0 wrote both ranks' RNG
    assert torch.equal(ckpt["model"]["fc.weight"].flatten()[:64], torch.tensor(r0["fc"]))
    single = train_loop(
        SHAPE,
        dict(TRAIN, autocast="none"),
        FakeStore(),
        *head(),
        tmp_path / "single",
        seed=3,
        resume=False,
        progress=False,
    )
    assert not torch.equal(single["model"].state_dict()["fc.weight"], ckpt["model"]["fc.weight"]), (
        "two ranks trained exactly like one: gradients were not averaged over different batches"
    )


def test_an_eagle3_head_trains_on_two_ranks_and_rank_0_keeps_both_generators(tmp_path):
    """train.method eagle3 under torchrun: the Kimi-scale plan's data-parallel run, on the tiny chat target."""
    from kimidflash.cpu_reference import tiny

    from .test_eagle3_train import phases, run_config

    target = tmp_path / "target"
    tiny.build_target(target, seed=0)
    runs = {}
    for name in ("ddp", "one"):
        cfg, run = run_config(tmp_path / name, target, steps=8, checkpoint_every=4)
        phases(cfg, run, "setup", "regen", "capture")
        runs[name] = (cfg, run)
    cfg, run = runs["ddp"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--standalone",
            "-m",
            "kimidflash",
            "train",
            cfg.path,
            "train",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert ddp["step"] == 8 and len(ddp["rng"]["data"]) == 2  # rank 0 wrote both ranks' generators
    assert [h["step"] for h in ddp["history"] if "heldout_loss" in h] == [4, 8]  # rank 0 measured held-out loss
    phases(*runs["one"], "train")
    one = torch.load(runs["one"][1] / "checkpoints" / "last.pt", weights_only=False)
    assert one["history"][0]["loss"] == pytest.approx(
        ddp["history"][0]["loss"], rel=1e-4
    )  # rank 0 drew the batches one process draws
    assert not torch.equal(one["model"]["fc.weight"], ddp["model"]["fc.weight"]), (
        "rank 0 trained as one process does: rank 1's gradients were not averaged in"
    )
