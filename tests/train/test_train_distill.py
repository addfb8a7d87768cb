"""Distillation against the target's top-k (train.distill, capture.topk): fast tier."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kimidflash.errors import CaptureError
from kimidflash.train import objective as obj
from kimidflash.train.batch import collate
from kimidflash.train.distill import soft_cross_entropy, table_from_prompt_logprobs, topk_table
from kimidflash.train.trainer import batch_loss, build_model

from .test_train_model import SHAPE, FakeStore, head

NEG = float("-inf")


def test_with_a_one_hot_target_the_loss_is_the_cross_entropy_on_that_token():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    target = torch.randint(50, (6,), generator=g)
    others = torch.randint(50, (6, 3), generator=g)
    idx = torch.cat([target[:, None], others], dim=1)
    one_hot = torch.tensor([[0.0, NEG, NEG, NEG]]).expand(6, 4)
    assert torch.allclose(soft_cross_entropy(logits, idx, one_hot), F.cross_entropy(logits, target, reduction="none"))


def test_a_spread_target_weighs_each_token_by_its_renormalised_probability():
    logits = torch.randn(1, 10)
    idx = torch.tensor([[2, 7]])
    logp = torch.log(torch.tensor([[0.3, 0.1]]))  # renormalised over the two: 0.75, 0.25
    logq = F.log_softmax(logits, -1)[0]
    want = -(0.75 * logq[2] + 0.25 * logq[7])
    assert torch.allclose(soft_cross_entropy(logits, idx, logp), want.view(1))


def test_the_stored_table_puts_the_prediction_of_token_t_on_row_t():
    logits = torch.randn(5, 30)  # row t: next-token logits after x_t
    ids, lp = topk_table(logits, 3)
    assert ids.shape == lp.shape == (5, 3) and ids.dtype == torch.int32 and lp.dtype == torch.float16
    assert ids[1:, 0].tolist() == logits[:-1].argmax(-1).tolist()
    assert torch.allclose(lp[1:].float(), F.log_softmax(logits[:-1], -1).topk(3).values, atol=2e-3)
    assert lp[0].tolist() == [0.0, NEG, NEG]  # row 0 predicts nothing


def test_vllm_prompt_logprobs_become_the_same_table():
    entries = [
        None,
        {"5": {"logprob": -0.1}, "9": {"logprob": -2.5}, "3": {"logprob": -3.0}},
        {"4": {"logprob": -1.5}, "8": {"logprob": -0.5}},
    ]  # vLLM adds the actual token if not in top k
    ids, lp = table_from_prompt_logprobs(entries, 2, "srv")
    assert ids[1].tolist() == [5, 9] and ids[2].tolist() == [8, 4]
    assert torch.allclose(lp[2].float(), torch.tensor([-0.5, -1.5]), atol=1e-3)
    with pytest.raises(CaptureError, match="need capture.topk=3"):
        table_from_prompt_logprobs(entries, 3, "srv")


def _batch(tables):
    store = FakeStore(n=3, seed=0)
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(len(store)):
        ids, lm, f = store.get(i)
        a, v = obj.sample_anchors(lm, 3, g)
        items.append((ids, lm, f, a, v))
    return collate(items, 4, 3, tables(store) if tables else None)


def _one_hot_tables(store, extra=None):
    out = []
    for ids, _, _ in store.items:
        T, k = len(ids), 3
        top = torch.stack([ids, (ids + 1) % 50, (ids + 2) % 50], dim=1).to(torch.int32)
        lp = torch.full((T, k), NEG)
        lp[:, 0] = 0.0
        if extra is not None:
            lp[:, 1] = extra
        out.append((top, lp.half()))
    return out


@pytest.mark.parametrize("frequent", [None, torch.tensor([4, 5])])
def test_distilling_a_one_hot_target_trains_exactly_like_cross_entropy(frequent):
    """Through collate and batch_loss, with and without the vocabulary subset
    (which must then hold every top-k token, not only the labels)."""
    model = build_model(SHAPE, *head(), seed=0, std=0.1)
    w = obj.loss_weights(4, 4.0)
    b = _batch(_one_hot_tables)
    # the reference CE runs over the same softmax: the subset then also holds the slots' top-k tokens
    same_vocab = None if frequent is None else torch.unique(torch.cat([frequent, b.soft_ids[b.label_ok].flatten()]))
    ce, _ = batch_loss(model, _batch(None), w, frequent=same_vocab)
    hard, info = batch_loss(model, b, w, frequent=frequent)
    assert torch.allclose(ce, hard, atol=1e-5)
    spread, _ = batch_loss(model, _batch(lambda s: _one_hot_tables(s, extra=-0.5)), w, frequent=frequent)
    assert not torch.allclose(ce, spread, atol=1e-3)  # the second token now counts
    if frequent is not None:
        assert info["vocab"] == len(same_vocab)  # labels + 1 and + 2 joined the step's softmax


def test_shards_carry_the_table_and_distillation_refuses_shards_without_it(tmp_path):
    import json

    from kimidflash.errors import TrainConfigError
    from kimidflash.train import config as train_config
    from kimidflash.train.capture import ShardStore, _stale, write_shard
    from kimidflash.train.data import Record
    from kimidflash.train.distill import Captured
    from kimidflash.train.trainer import _train_store

    from ..support.helpers import CONFIGS

    recs = [Record("a", "", [1, 2, 3, 4], [0, 1, 1, 1], "stop"), Record("b", "", [5, 6, 7], [0, 1, 1], "stop")]

    class Source:
        layer_ids = [0]

        def __init__(self, k):
            self.k = k

        def capture(self, ids):
            t = len(ids)
            table = (torch.zeros(t, self.k, dtype=torch.int32), torch.zeros(t, self.k, dtype=torch.float16))
            return Captured(torch.ones(t, 8), table if self.k else None)

        def capture_many(self, seqs):
            return [self.capture(ids) for ids in seqs]

    cap = tmp_path / "capture"
    cap.mkdir()
    write_shard(cap / "shard-00000.safetensors", recs, Source(0), "hf float32")
    (cap / "index.json").write_text(
        json.dumps(
            {
                "layer_ids": [0],
                "topk": 0,
                "shards": [{"file": "shard-00000.safetensors", "kind": "train", "ids": ["a", "b"]}],
            }
        )
    )
    assert not _stale(cap / "shard-00000.safetensors", recs, 0, "hf float32")
    assert _stale(cap / "shard-00000.safetensors", recs, 4, "hf float32")  # asked for a table it lacks: capture again
    assert _stale(cap / "shard-00000.safetensors", recs, 0, "hf bfloat16")  # another precision: capture again
    from safetensors.torch import load_file, save_file

    unlabelled = cap / "shard-old.safetensors"  # written before shards named their source: all float32, kept
    save_file(load_file(cap / "shard-00000.safetensors"), unlabelled, metadata={"ids": json.dumps(["a", "b"])})
    assert not _stale(unlabelled, recs, 0, "hf float32")
    unlabelled.unlink()
    cfg = train_config.load(CONFIGS / "train-overfit-gate.json", {"train.distill": True})
    with pytest.raises(TrainConfigError, match="capture.topk"):
        _train_store(cfg, tmp_path, cfg.shape(), "/nonexistent")
    write_shard(cap / "shard-00000.safetensors", recs, Source(4), "hf float32")
    store = _train_store(cfg, tmp_path, cfg.shape(), "/nonexistent")
    assert store.has_topk and store.topk(1)[0].shape == (3, 4)
    assert not _stale(cap / "shard-00000.safetensors", recs, 4, "hf float32")
    assert isinstance(store, ShardStore)
