"""Training changes that learn more per CPU-hour: the vocabulary subset, layers
started from the target's, wall-clock chunks (fast tier, tiny shapes)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from kimidflash.errors import TrainConfigError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.train import objective as obj
from kimidflash.train import vocab
from kimidflash.train.batch import collate
from kimidflash.train.data import Record
from kimidflash.train.trainer import batch_loss, build_model, train_loop
from kimidflash.train.warmstart import COPIED, target_layer_tensors

from .test_train_model import SHAPE, TRAIN, FakeStore, head


def _batch(seed=0):
    store = FakeStore(n=3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(len(store)):
        ids, lm, f = store.get(i)
        a, v = obj.sample_anchors(lm, 3, g)
        items.append((ids, lm, f, a, v))
    return collate(items, 4, 3)


def test_frequent_tokens_rank_by_count_over_response_tokens_only():
    recs = [
        Record("a", "", [7, 7, 7, 5, 5, 9], [0, 0, 1, 1, 1, 1], "stop"),
        Record("b", "", [9, 9, 5, 2], [1, 1, 1, 1], "stop"),
    ]
    # response counts: 5 x3, 9 x3, 7 x1, 2 x1 (the prompt's two 7s do not count); ties by the smaller id
    assert vocab.frequent_tokens(recs, 2).tolist() == [5, 9]
    assert vocab.frequent_tokens(recs, 3).tolist() == [2, 5, 9]
    with pytest.raises(ValueError, match="vocab_subset"):
        vocab.frequent_tokens(recs, 0)


def test_step_vocabulary_holds_every_label_of_the_batch():
    labels = torch.tensor([40, 3, 40, 17])
    ids = vocab.step_vocab(torch.tensor([1, 3, 5]), labels)
    assert ids.tolist() == [1, 3, 5, 17, 40]
    assert ids[vocab.subset_targets(ids, labels)].tolist() == labels.tolist()
    with pytest.raises(ValueError, match="missing"):
        vocab.subset_targets(torch.tensor([1, 3]), torch.tensor([2]))


def test_subset_over_the_whole_vocabulary_is_the_full_softmax_and_a_small_one_differs():
    model = build_model(SHAPE, *head(), seed=0, std=0.1)
    b, w = _batch(), obj.loss_weights(4, 4.0)
    full, info_full = batch_loss(model, b, w)
    same, info_same = batch_loss(model, b, w, frequent=torch.arange(50))
    assert torch.allclose(full, same, atol=1e-6) and info_same["vocab"] == info_full["vocab"] == 50
    small, info_small = batch_loss(model, b, w, frequent=torch.tensor([4]))
    labels = b.labels[b.label_ok]
    assert info_small["vocab"] == len(torch.unique(torch.cat([torch.tensor([4]), labels])))
    assert small < full  # fewer negatives: a smaller partition function


def test_train_loop_with_a_vocabulary_subset_learns_and_records_it(tmp_path):
    tc = dict(TRAIN, steps=30, lr=3e-3, checkpoint_every=100, autocast="none")
    res = train_loop(
        SHAPE,
        tc,
        FakeStore(n=2),
        *head(),
        tmp_path,
        seed=0,
        resume=False,
        progress=False,
        frequent=torch.tensor([4, 5, 6]),
    )
    first = sum(h["loss"] for h in res["history"][:5]) / 5
    assert sum(h["loss"] for h in res["history"][-5:]) / 5 < 0.7 * first


def _target(tmp_path, shape: DrafterShape, layers=3, intermediate=None):
    """A Llama-named target checkpoint whose layers have the drafter's shape (or another MLP width)."""
    g = torch.Generator().manual_seed(5)
    H, hd, inter = shape.hidden_size, shape.head_dim, intermediate or shape.intermediate_size
    sizes = {
        "self_attn.q_proj.weight": (shape.num_attention_heads * hd, H),
        "self_attn.k_proj.weight": (shape.num_key_value_heads * hd, H),
        "self_attn.v_proj.weight": (shape.num_key_value_heads * hd, H),
        "self_attn.o_proj.weight": (H, shape.num_attention_heads * hd),
        "mlp.gate_proj.weight": (inter, H),
        "mlp.up_proj.weight": (inter, H),
        "mlp.down_proj.weight": (H, inter),
        "input_layernorm.weight": (H,),
        "post_attention_layernorm.weight": (H,),
    }
    tensors = {f"model.layers.{L}.{k}": torch.randn(s, generator=g) for L in range(layers) for k, s in sizes.items()}
    tensors["model.embed_tokens.weight"] = torch.randn(shape.vocab_size, H, generator=g)  # where the layers are found
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tensors


def test_draft_layers_start_from_the_named_target_layers(tmp_path):
    shape = DrafterShape.coerce(SHAPE)
    target = _target(tmp_path, shape)
    model = build_model(SHAPE, *head(), seed=0, std=TRAIN["init_std"])  # what train_loop builds
    init = target_layer_tensors(tmp_path, [2, 0], shape)
    assert set(init) == {f"layers.{i}.{n}" for i in (0, 1) for n in COPIED}
    res = train_loop(
        SHAPE,
        dict(TRAIN, steps=0),
        FakeStore(),
        *head(),
        tmp_path / "ck",
        seed=0,
        resume=False,
        progress=False,
        init=init,
    )
    state = res["model"].state_dict()
    for n in COPIED:
        assert torch.equal(state[f"layers.0.{n}"], target[f"model.layers.2.{n}"])
        assert torch.equal(state[f"layers.1.{n}"], target[f"model.layers.0.{n}"])
    assert torch.equal(state["layers.0.self_attn.q_norm.weight"], torch.ones(shape.head_dim))  # no Llama twin
    assert torch.equal(state["fc.weight"], model.state_dict()["fc.weight"])  # not a layer: as initialised


@pytest.mark.parametrize(
    "layers, intermediate, words",
    [
        ([0], None, "lists 1 target layers; the drafter has 2"),
        ([0, 7], None, "has no model.layers.7."),
        ([0, 1], 80, "layers.0.mlp.gate_proj.weight is [80, 64], the drafter's is [96, 64]"),
    ],
)
def test_a_target_that_cannot_seed_the_drafter_is_refused(tmp_path, layers, intermediate, words):
    shape = DrafterShape.coerce(SHAPE)
    _target(tmp_path, shape, intermediate=intermediate)
    with pytest.raises(TrainConfigError, match="init_from_target") as exc:
        target_layer_tensors(tmp_path, layers, shape)
    assert words in str(exc.value)


def test_a_wall_clock_chunk_stops_with_a_checkpoint_and_resumes(tmp_path):
    store = FakeStore()
    first = train_loop(SHAPE, TRAIN, store, *head(), tmp_path, seed=3, resume=False, progress=False, max_seconds=1e-9)
    assert first["step"] == 1 and (tmp_path / "last.pt").is_file()
    rest = train_loop(SHAPE, TRAIN, store, *head(), tmp_path, seed=3, resume=True, progress=False)
    full = train_loop(SHAPE, TRAIN, store, *head(), tmp_path / "full", seed=3, resume=False, progress=False)
    assert rest["step"] == full["step"] == TRAIN["steps"]
    assert torch.equal(rest["model"].state_dict()["fc.weight"], full["model"].state_dict()["fc.weight"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--seconds", "0"], "--seconds must be positive"),
        (["--variant", "a"], "--variant names repeat"),
        (["--variant", "b", "train.nope=1"], "unknown key 'nope'"),
        (["--eval-run", "bb"], "--eval-run bb: expected NAME=CONFIG"),
        (["--eval-run", "bb=configs/train-cpu-reference.json"], "is not evaluation-only"),
        (["--eval-run", "bb=configs/eval-real-bigbench-heldout.json"], "has no capture/ folder"),
    ],
)
def test_train_compare_refuses_bad_input_before_training(tmp_path, monkeypatch, args, words):
    from kimidflash.train import compare_cli as compare

    monkeypatch.setenv("KIMIDFLASH_CACHE", str(tmp_path / "cache"))  # the eval run's folder: empty

    (tmp_path / "base" / "capture").mkdir(parents=True)
    base = [
        "configs/train-cpu-reference.json",
        "--base-run",
        str(tmp_path / "base"),
        "--seconds",
        "5",
        "--out",
        str(tmp_path / "out"),
        "--variant",
        "a",
    ]
    with pytest.raises(TrainConfigError) as refused:
        compare.main(base + args)
    assert words in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_train_compare_summary_tabulates_every_variant():
    from kimidflash.train.compare import summary_markdown

    rows = [
        {
            "variant": v,
            "overrides": o,
            "steps": s,
            "steps_per_second": s / 10,
            "loss_mean_last50": 5.0,
            "budget_seconds": 10,
            "offline": {"3": {"mean_acceptance_length": al}},
        }
        for v, o, s, al in (("baseline", {}, 10, 1.2), ("vocab", {"train.vocab_subset": 4096}, 30, 1.5))
    ]
    md = summary_markdown(rows)
    assert "| baseline | (the config as is) | 10 | 1.000 | 5.000 | 1.2000 |" in md
    assert "| vocab | `train.vocab_subset=4096` | 30 | 3.000 | 5.000 | 1.5000 |" in md
    for r, walk in zip(rows, (1.1, 1.4), strict=False):  # --eval-run: the walk on another run's records, a column each
        r["offline_on"] = {"bb": {"records": 256, "by_k": {"3": {"walk_mean_acceptance_length": walk}}}}
    md = summary_markdown(rows)
    assert "| walk AL k=3 on bb |" in md and "| 1.5000 | 1.4000 (256 records) |" in md


def test_train_compare_records_path_overrides_portably():
    from kimidflash.paths import cache_dir
    from kimidflash.train.compare import portable_overrides

    got = portable_overrides(
        {
            "train.init_from_drafter": str(cache_dir() / "drafters" / "v4"),
            "train.steps": 3,
            "drafter_config": "smollm2-dflash-draft-4l.json",
        }
    )
    assert got == {
        "train.init_from_drafter": "$KIMIDFLASH_CACHE/drafters/v4",
        "train.steps": 3,
        "drafter_config": "smollm2-dflash-draft-4l.json",
    }
