"""Drafter forward pass, resumable training and export (fast tier, tiny shapes)."""

from __future__ import annotations

import json

import pytest
import torch

from kimidflash.formats.drafter_export import expected_tensors, export_model
from kimidflash.train.batch import collate
from kimidflash.train.trainer import build_model, train_loop

SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 50,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "block_size": 4,
    "num_target_layers": 6,
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3]},
    "training": {"block_size": 4},
}
TRAIN = {
    "steps": 6,
    "batch_size": 2,
    "anchors_per_seq": 3,
    "block_size": 4,
    "gamma": 4.0,
    "lr": 1e-3,
    "weight_decay": 0.0,
    "warmup_steps": 2,
    "min_lr_ratio": 0.1,
    "grad_clip": 1.0,
    "autocast": "bfloat16",
    "checkpoint_every": 2,
    "log_every": 1,
    "threads": 1,
    "init_std": 0.05,
}


class FakeStore:
    """Random sequences with a prompt part and a response part, and random features."""

    def __init__(self, n=5, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            T = int(torch.randint(10, 20, (1,), generator=g))
            ids = torch.randint(4, 50, (T,), generator=g)
            lm = (torch.arange(T) >= 4).long()
            self.items.append((ids, lm, torch.randn(T, 128, generator=g)))

    def __len__(self):
        return len(self.items)

    def get(self, i):
        return self.items[i]


def head():
    g = torch.Generator().manual_seed(1)
    e = torch.randn(50, 64, generator=g)
    return e, e


def test_block_output_ignores_context_at_or_after_anchor():
    model = build_model(SHAPE, *head(), seed=0, std=0.1).eval()
    ids, lm, f = FakeStore().get(0)
    anchors, valid = torch.tensor([6, 9]), torch.tensor([True, True])
    b = collate([(ids, lm, f, anchors, valid)], 4, 3)
    h1 = model.hidden(b.feats, b.block_ids, b.block_pos, b.mask)
    feats2 = b.feats.clone()
    feats2[0, 6:] += 5.0  # positions >= first anchor: block 0 must not see them
    h2 = model.hidden(feats2, b.block_ids, b.block_pos, b.mask)
    assert torch.allclose(h1[0, :4], h2[0, :4], atol=1e-5)
    assert not torch.allclose(h1[0, 4:], h2[0, 4:], atol=1e-3)  # block 1 (anchor 9) sees 6..8


def test_interrupted_and_resumed_training_equals_uninterrupted(tmp_path):
    store = FakeStore()
    full = train_loop(SHAPE, TRAIN, store, *head(), tmp_path / "a", seed=3, resume=False, progress=False)
    train_loop(SHAPE, TRAIN, store, *head(), tmp_path / "b", seed=3, resume=False, stop_at=3, progress=False)
    resumed = train_loop(SHAPE, TRAIN, store, *head(), tmp_path / "b", seed=3, resume=True, progress=False)
    assert resumed["step"] == full["step"] == 6
    a, b = full["model"].state_dict(), resumed["model"].state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [h["loss"] for h in full["history"]] == [h["loss"] for h in resumed["history"]]
    other = train_loop(SHAPE, TRAIN, store, *head(), tmp_path / "c", seed=4, resume=False, progress=False)
    assert not torch.equal(other["model"].state_dict()["fc.weight"], a["fc.weight"])


def test_training_lowers_the_loss_on_a_fixed_batch(tmp_path):
    tc = dict(TRAIN, steps=40, lr=3e-3, checkpoint_every=100, autocast="none")
    res = train_loop(SHAPE, tc, FakeStore(n=2), *head(), tmp_path, seed=0, resume=False, progress=False)
    first = sum(h["loss"] for h in res["history"][:5]) / 5
    last = sum(h["loss"] for h in res["history"][-5:]) / 5
    assert last < 0.7 * first


def test_export_names_shapes_and_config(tmp_path):
    model = build_model(SHAPE, *head(), seed=0, std=0.1)
    out = export_model(model.state_dict(), SHAPE, tmp_path / "drafter", "bfloat16", {"manifest.json": b"{}"})
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open has keys() but is neither iterable nor a container)
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    assert got == expected_tensors(SHAPE)
    assert got["fc.weight"] == (64, 128)
    assert not any(k.startswith(("model.", "embed_tokens", "lm_head")) for k in got)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [1, 3]}
    assert cfg["block_size"] == 4 and cfg["num_target_layers"] == 6
    assert "layer_types" not in cfg and "training" not in cfg


def test_export_refuses_a_state_that_does_not_match_the_shape(tmp_path):
    state = build_model(SHAPE, *head(), seed=0, std=0.1).state_dict()
    state.pop("norm.weight")
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\]"):
        export_model(state, SHAPE, tmp_path / "d")


def test_the_drafter_readme_names_the_setup_prompts_and_what_auto_autocast_meant():
    """Setup's prompt set (a later phase's config may still name the default one) and the resolved autocast."""
    from kimidflash.paths import REPO_ROOT
    from kimidflash.train.config import load
    from kimidflash.train.export_run import drafter_readme

    cfg = load(REPO_ROOT / "configs" / "train-cpu-reference.json")
    manifest = {
        "prompts": {"source": "synthetic:15850", "count": 15850},
        "train": {"final_loss_mean_last50": 1.5, "bf16_autocast": True},
    }
    text = drafter_readme(cfg, manifest, {"step": 12}, None)
    assert "prompts `synthetic:15850`" in text and "autocast auto (= bf16 on the training machine)" in text
    old = drafter_readme(cfg, {"train": {}}, {"step": 12}, None)  # a manifest from before either was recorded
    assert f"prompts `{cfg.data.prompts}`" in old and "autocast auto;" in old
    assert "init_from_drafter" not in old
    grown = drafter_readme(
        cfg, {"train": {"config": {"init_from_drafter": "$KIMIDFLASH_CACHE/drafters/v4"}}}, {"step": 12}, None
    )
    assert "started from the drafter in `$KIMIDFLASH_CACHE/drafters/v4` (`train.init_from_drafter`)" in grown
    # the train phase's options (its --set overrides), not the export invocation's config; the loss rounded
    trained = drafter_readme(
        cfg,
        {"train": {"config": {"lr": 0.0005, "batch_size": 32}, "final_loss_mean_last50": 1.4357677999999996}},
        {"step": 12},
        None,
    )
    assert "batch 32 x" in trained and "lr 0.0005," in trained and f"lr {cfg.train.lr}" not in trained
    assert "last 50 steps: 1.435768" in trained


def test_the_drafter_readme_gives_the_walk_and_says_when_the_run_folder_was_copied():
    from kimidflash.paths import REPO_ROOT
    from kimidflash.train.config import load
    from kimidflash.train.export_run import drafter_readme

    cfg = load(REPO_ROOT / "configs" / "train-cpu-reference.json")
    inv = [{"argv": ["./train-drafter.sh", "C", "train", "--run-dir", d]} for d in ("R3", "R3", "R4")]
    ev = {
        "split": "heldout",
        "by_k": {
            "3": {
                "drafts": 10,
                "mean_acceptance_length": 2.4,
                "per_position": [0.6],
                "walk": {"mean_acceptance_length": 2.1},
            }
        },
    }
    text = drafter_readme(cfg, {"train": {}, "invocations": inv}, {"step": 12}, ev)
    assert "mean length 2.4, per position [0.6]; 2.1 as a server walks" in text
    assert "the commands on `R3` made it, and those on `R4` continued a copy" in text
    one = drafter_readme(cfg, {"train": {}, "invocations": inv[:2]}, {"step": 12}, None)
    assert "copied" not in one and "./train-drafter.sh C train --run-dir R3" in one
