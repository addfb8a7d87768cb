"""train.select_every: the checkpoint kept is the one that walked best on held-out records (fast tier)."""

from __future__ import annotations

import json

import pytest
import torch

from kimidflash.errors import TrainConfigError
from kimidflash.train import config as tcfg
from kimidflash.train import select
from kimidflash.train.evaluate import checkpoint_path, checkpoint_state, offline_acceptance
from kimidflash.train.trainer import build_model, train_loop

from ..support.helpers import CONFIGS
from .test_train_model import SHAPE, TRAIN, FakeStore, head


def _selector(tmp_path, logs, every=2):
    return select.WalkSelect(
        FakeStore(8, seed=5),
        k=3,
        records=8,
        every=every,
        autocast="none",
        path=tmp_path / "checkpoints" / "best.pt",
        log=logs.append,
    )


def _train(tmp_path, sel):
    """TRAIN's six steps in float32 from seed 0, `sel` called after each."""
    return train_loop(
        SHAPE,
        dict(TRAIN, autocast="none"),
        FakeStore(),
        *head(),
        tmp_path / "checkpoints",
        seed=0,
        resume=False,
        progress=False,
        select=sel,
    )


def test_best_pt_holds_the_weights_of_the_step_that_walked_best_not_the_last(tmp_path, monkeypatch):
    walks, seen = iter([1.20, 1.50, 1.30]), {}
    real = offline_acceptance

    def scripted(model, store, k, max_records, autocast):
        real(model, store, k, max_records, autocast=autocast)  # runs as it would, on the held-out store
        seen[len(seen) + 1] = model.fc.weight.detach().clone()
        return {"walk": {"mean_acceptance_length": next(walks)}}

    monkeypatch.setattr(select, "offline_acceptance", scripted)
    logs: list[str] = []
    res = _train(tmp_path, _selector(tmp_path, logs))
    assert [(h["step"], h["select_walk"]) for h in res["history"] if "select_walk" in h] == [
        (2, 1.2),
        (4, 1.5),
        (6, 1.3),
    ]
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=False)
    assert best["step"] == 4 and best["walk"] == 1.5
    assert torch.equal(best["model"]["fc.weight"], seen[2])  # the second walk was step 4's
    assert not torch.equal(best["model"]["fc.weight"], res["model"].fc.weight.detach())
    assert checkpoint_path(tmp_path) == tmp_path / "checkpoints" / "best.pt"
    assert "step 4: walk 1.5000" in logs[1] and "best so far" in logs[1] and "(best 1.5000)" in logs[2]


def test_the_kept_checkpoint_walks_what_it_was_kept_for(tmp_path):
    """Unscripted: best.pt's weights, loaded again, walk exactly the figure it was kept at."""
    sel = _selector(tmp_path, [], every=3)
    _train(tmp_path, sel)
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=False)
    model = build_model(SHAPE, *head(), seed=0, std=0.1)
    model.load_state_dict(best["model"])
    walk = offline_acceptance(model.eval(), sel.store, 3, 8)["walk"]["mean_acceptance_length"]
    assert walk == pytest.approx(best["walk"]) == pytest.approx(sel.best)


def test_without_a_best_checkpoint_eval_takes_the_last(tmp_path):
    assert checkpoint_path(tmp_path) == tmp_path / "checkpoints" / "last.pt"


def test_eval_and_export_get_best_weights_and_step_with_last_pts_shape_and_history(tmp_path):
    """What export reads besides the weights (shape, history, options) is last.pt's; the weights and
    the step are best.pt's."""
    res = _train(tmp_path, _selector(tmp_path, [], every=2))
    last = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=False)
    st = checkpoint_state(tmp_path)
    assert st["step"] == best["step"] and st["walk"] == best["walk"]
    assert st["model"].keys() == best["model"].keys()
    assert all(torch.equal(st["model"][n], best["model"][n]) for n in best["model"])
    assert st["shape"] == last["shape"] and st["history"] == last["history"] == res["history"]
    (tmp_path / "checkpoints" / "best.pt").unlink()
    assert checkpoint_state(tmp_path)["step"] == last["step"] == 6


def _capture(run, heldout):
    (run / "capture").mkdir(parents=True)
    shards = [{"file": "missing.safetensors", "kind": "train", "ids": ["a"]}]
    if heldout:
        shards.append({"file": "missing.safetensors", "kind": "heldout", "ids": ["b"] * heldout})
    (run / "capture" / "index.json").write_text(json.dumps({"shards": shards}))


def test_a_run_with_too_few_held_out_records_is_refused_naming_both_keys(tmp_path):
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"train.select_every": 200})
    _capture(tmp_path, heldout=0)
    with pytest.raises(TrainConfigError, match=r"needs 256 held-out records \(train.select_records\).*holds 0.*"):
        select.WalkSelect.for_run(cfg, tmp_path, resume=False)
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"train.select_every": 200, "capture.mode": "stream"})
    with pytest.raises(TrainConfigError, match="capture.mode=cache"):
        select.WalkSelect.for_run(cfg, tmp_path, resume=False)
    assert select.WalkSelect.for_run(tcfg.load(CONFIGS / "train-cpu-reference.json"), tmp_path, False) is None


def test_resume_keeps_the_best_walk_and_a_fresh_run_drops_an_old_best(tmp_path, monkeypatch):
    import safetensors.torch

    run = tmp_path / "run"
    (run / "capture").mkdir(parents=True)
    ids = [f"r{i}" for i in range(3)]
    safetensors.torch.save_file(
        {"offsets": torch.tensor([0, 1, 2, 3]), "input_ids": torch.zeros(3, dtype=torch.int32)},
        str(run / "capture" / "h.safetensors"),
    )
    (run / "capture" / "index.json").write_text(
        json.dumps({"shards": [{"file": "h.safetensors", "kind": "heldout", "ids": ids}]})
    )
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"train.select_every": 2, "train.select_records": 3})
    (run / "checkpoints").mkdir()
    torch.save({"walk": 1.75, "step": 2, "model": {}}, run / "checkpoints" / "best.pt")
    sel = select.WalkSelect.for_run(cfg, run, resume=True)
    assert sel is not None and sel.best == 1.75 and sel.records == 3 and sel.k == cfg.eval.k[0]
    sel = select.WalkSelect.for_run(cfg, run, resume=False)
    assert sel is not None and sel.best == float("-inf") and not (run / "checkpoints" / "best.pt").exists()
