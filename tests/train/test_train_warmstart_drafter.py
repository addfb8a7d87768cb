"""train.init_from_drafter: start from an exported drafter, growing its layers without changing what it computes."""

from __future__ import annotations

import pytest
import torch

from kimidflash.errors import TrainConfigError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.formats.drafter_export import export_model
from kimidflash.train.batch import collate
from kimidflash.train.trainer import build_model, train_loop
from kimidflash.train.warmstart import drafter_tensors

from .test_train_model import SHAPE, TRAIN, FakeStore, head

DEEPER = {**SHAPE, "num_hidden_layers": 4}


def _exported(tmp_path, shape=SHAPE, seed=0):
    """A trained-looking drafter (random weights, std 0.1) exported as the export phase writes it, in float32."""
    model = build_model(shape, *head(), seed=seed, std=0.1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.1)
    out = tmp_path / "src-drafter"
    export_model(model.state_dict(), DrafterShape.coerce(shape), out, dtype="float32")
    return model, out


def _hidden(model):
    ids, lm, f = FakeStore().get(0)
    b = collate([(ids, lm, f, torch.tensor([6, 9]), torch.tensor([True, True]))], 4, 3)
    return model.hidden(b.feats, b.block_ids, b.block_pos, b.mask)


@pytest.mark.parametrize("shape", [SHAPE, DEEPER], ids=["same-depth", "grown-to-4"])
def test_a_run_started_from_a_drafter_computes_what_it_did(tmp_path, shape):
    src, out = _exported(tmp_path)
    init = drafter_tensors(out, DrafterShape.coerce(shape))
    res = train_loop(
        shape,
        dict(TRAIN, steps=0),
        FakeStore(),
        *head(),
        tmp_path / "ck",
        seed=3,
        resume=False,
        progress=False,
        init=init,
    )
    grown = res["model"].eval()
    with torch.no_grad():
        assert torch.allclose(_hidden(grown), _hidden(src.eval()), atol=1e-5)
    state = grown.state_dict()
    for name, t in src.state_dict().items():
        assert torch.equal(state[name], t), name
    if shape is DEEPER:  # the new layers say nothing yet, but are not all zero: they can learn
        for i in (2, 3):
            assert not state[f"layers.{i}.self_attn.o_proj.weight"].any()
            assert not state[f"layers.{i}.mlp.down_proj.weight"].any()
            assert state[f"layers.{i}.self_attn.q_proj.weight"].abs().sum() > 0


def test_grown_layers_learn(tmp_path):
    _, out = _exported(tmp_path)
    init = drafter_tensors(out, DrafterShape.coerce(DEEPER))
    res = train_loop(
        DEEPER,
        dict(TRAIN, steps=4, autocast="none"),
        FakeStore(),
        *head(),
        tmp_path / "ck",
        seed=3,
        resume=False,
        progress=False,
        init=init,
    )
    state = res["model"].state_dict()
    assert state["layers.3.self_attn.o_proj.weight"].abs().sum() > 0
    assert state["layers.3.mlp.down_proj.weight"].abs().sum() > 0


@pytest.mark.parametrize(
    "change, words",
    [
        ({"num_hidden_layers": 1}, "has 2 layers, the drafter 1; a drafter can grow from its source, not shrink"),
        ({"hidden_size": 32, "head_dim": 8}, "hidden_size is 64 in"),
        (
            {"dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 2]}},
            "dflash_config.target_layer_ids is (1, 3) in",
        ),
        ({"dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 3]}}, "dflash_config.mask_token_id is 3 in"),
    ],
)
def test_a_source_that_does_not_fit_is_refused_naming_the_key(tmp_path, change, words):
    _, out = _exported(tmp_path)
    with pytest.raises(TrainConfigError, match="init_from_drafter") as exc:
        drafter_tensors(out, DrafterShape.coerce({**SHAPE, **change}))
    assert words in str(exc.value)


def test_a_folder_without_weights_or_with_a_wrong_tensor_is_refused(tmp_path):
    with pytest.raises(TrainConfigError, match="has no model.safetensors"):
        drafter_tensors(tmp_path, DrafterShape.coerce(SHAPE))
    from safetensors.torch import load_file, save_file

    _, out = _exported(tmp_path)
    t = load_file(str(out / "model.safetensors"))
    t["layers.1.mlp.up_proj.weight"] = t["layers.1.mlp.up_proj.weight"][:, :10].contiguous()
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(TrainConfigError, match=r"layers.1.mlp.up_proj.weight is \[96, 10\], expected \[96, 64\]"):
        drafter_tensors(out, DrafterShape.coerce(SHAPE))


def test_an_exported_drafter_is_measured_as_it_computes(tmp_path, monkeypatch):
    """eval --drafter: the exported weights, with the target's embeddings and head, are the model measured."""
    from kimidflash.train import evaluate as ev

    src, out = _exported(tmp_path)
    monkeypatch.setattr(ev, "load_target_head", lambda _: head())
    loaded = ev.load_exported_model(out, "target-unused")
    with torch.no_grad():
        assert torch.allclose(_hidden(loaded), _hidden(src.eval()), atol=1e-5)
    assert ev.offline_acceptance(loaded, FakeStore(), 3, 5) == ev.offline_acceptance(src.eval(), FakeStore(), 3, 5)


def test_drafter_is_only_for_the_eval_phase_alone(tmp_path):
    from kimidflash.errors import TrainConfigError
    from kimidflash.train.cli import main

    from ..support.helpers import CONFIGS

    argv = [str(CONFIGS / "train-cpu-reference.json"), "train", "eval", "--drafter", str(tmp_path)]
    with pytest.raises(TrainConfigError, match="--drafter measures an exported drafter: run the eval phase alone"):
        main([*argv, "--run-dir", str(tmp_path / "run")])


@pytest.mark.parametrize(
    "train_block, ks, refused",
    [(16, [3, 4], 4), (2, [3], None)],
    ids=["k-beyond-the-drafter", "run-trained-smaller-blocks"],
)
def test_eval_k_is_checked_against_the_measured_drafters_blocks_before_any_work(
    tmp_path, monkeypatch, train_block, ks, refused
):
    """eval --drafter: k is bounded by the exported drafter's block size (4 here), not the run's train.block_size,
    and a k it cannot serve is refused before the first k is scored (nothing measured is thrown away)."""
    from kimidflash.train import config as tcfg
    from kimidflash.train import evaluate as ev

    from ..support.helpers import CONFIGS

    _, out = _exported(tmp_path)
    cfg = tcfg.load(
        CONFIGS / "train-cpu-reference.json", tcfg.parse_set([f"train.block_size={train_block}", f"eval.k={ks}"])
    )
    scored: list[int] = []
    monkeypatch.setattr(ev, "load_target_head", lambda _: head())
    monkeypatch.setattr(ev, "target_info", lambda _: type("T", (), {"model_dir": "target-unused"}))
    monkeypatch.setattr(ev, "check_mode", lambda _: "cache")
    monkeypatch.setattr(ev, "ShardStore", lambda *a: FakeStore())
    result = {"mean_acceptance_length": 1.0, "drafts": 1, "per_position": [], "walk": {"mean_acceptance_length": 1.0}}
    monkeypatch.setattr(ev, "offline_acceptance", lambda m, s, k, *a, **kw: scored.append(k) or result)
    if refused:
        message = rf"eval.k {refused}: needs a block of 5 > the drafter's block size 4 \(.*src-drafter\)"
        with pytest.raises(TrainConfigError, match=message):
            ev.evaluate_run(cfg, tmp_path, log=lambda *_: None, drafter=out)
        assert scored == []
    else:
        ev.evaluate_run(cfg, tmp_path, log=lambda *_: None, drafter=out)
        assert scored == ks and (tmp_path / "eval-src-drafter.json").is_file()


def test_another_runs_checkpoint_is_measured_on_this_runs_records(tmp_path, monkeypatch):
    """train-compare --eval-run: a variant's last checkpoint scored on an evaluation-only run's records."""
    from kimidflash.train import config as tcfg
    from kimidflash.train import evaluate as ev

    from ..support.helpers import CONFIGS

    res = train_loop(
        SHAPE,
        dict(TRAIN, steps=2, autocast="none"),
        FakeStore(),
        *head(),
        tmp_path / "variant" / "checkpoints",
        seed=3,
        resume=False,
        progress=False,
    )
    monkeypatch.setattr(ev, "load_target_head", lambda _: head())
    monkeypatch.setattr(ev, "target_info", lambda _: type("T", (), {"model_dir": "target-unused"}))
    monkeypatch.setattr(ev, "check_mode", lambda _: "cache")
    monkeypatch.setattr(ev, "ShardStore", lambda *a: FakeStore())
    cfg = tcfg.load(CONFIGS / "eval-real-bigbench-heldout.json", tcfg.parse_set(["eval.k=[3]", "train.autocast=none"]))
    (tmp_path / "eval-run").mkdir()
    got = ev.evaluate_run(
        cfg,
        tmp_path / "eval-run",
        log=lambda *_: None,
        checkpoint_run=tmp_path / "variant",
        result="eval-compare-v.json",
    )
    want = ev.offline_acceptance(res["model"].eval(), FakeStore(), 3, cfg.eval.max_records, autocast="none")
    assert got["by_k"]["3"] == want and got["step"] == 2
    assert (tmp_path / "eval-run" / "eval-compare-v.json").is_file()
    assert not (tmp_path / "variant" / "eval-compare-v.json").exists()
