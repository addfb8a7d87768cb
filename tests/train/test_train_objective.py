"""The DFlash objective's pieces against their definitions (fast tier)."""

from __future__ import annotations

import math

import pytest
import torch

from kimidflash.train import objective as obj


@pytest.mark.parametrize("seed", range(6))
def test_attention_mask_equals_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    T, B, A = 23, 4, 5
    lm = (torch.rand(T, generator=g) > 0.3).long()
    anchors, valid = obj.sample_anchors(lm, A, g)
    ctx_valid = torch.arange(T) < T - 2 - seed % 3
    got = obj.attention_mask(anchors, valid, T, B, ctx_valid)
    want = torch.tensor(obj.brute_force_mask(anchors.tolist(), valid.tolist(), T, B, ctx_valid.tolist()))
    assert got.shape == (A * B, T + A * B)
    assert torch.equal(got, want)


def test_block_query_sees_strictly_earlier_context_and_its_whole_block():
    m = obj.attention_mask(torch.tensor([3, 6]), torch.tensor([True, True]), 8, 2)
    # block 0 (anchor 3), both slots: context 0..2 only, own block slots (cols 8, 9)
    assert m[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert m[1].tolist() == m[0].tolist()
    assert m[2].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("seed", range(20))
def test_anchors_only_where_loss_mask_holds(seed):
    g = torch.Generator().manual_seed(seed)
    T = 40
    lm = (torch.rand(T, generator=g) > 0.6).long()
    anchors, valid = obj.sample_anchors(lm, 16, g)
    real = anchors[valid]
    assert len(real) == min(16, int(lm[:-1].sum()))
    assert all(lm[a] == 1 and a + 1 < T for a in real.tolist())
    assert len(set(real.tolist())) == len(real)


def test_no_anchor_when_no_response():
    anchors, valid = obj.sample_anchors(torch.zeros(10, dtype=torch.long), 4, torch.Generator())
    assert not valid.any()


def test_loss_weights_decay_from_slot_one():
    w = obj.loss_weights(8, 4.0)
    assert w[0] == 0
    assert w[1] == pytest.approx(1.0)
    for k in range(1, 8):
        assert w[k] == pytest.approx(math.exp(-(k - 1) / 4.0))
    with pytest.raises(ValueError, match="gamma"):
        obj.loss_weights(8, 0)


def test_block_labels_count_only_response_tokens_in_range():
    ids = torch.arange(100, 110)
    lm = torch.tensor([0, 0, 0, 1, 1, 1, 0, 1, 1, 1])
    labels, ok = obj.block_labels(ids, lm, torch.tensor([4, 8]), torch.tensor([True, True]), 4)
    assert labels[0].tolist() == [104, 105, 106, 107]
    assert ok[0].tolist() == [False, True, False, True]  # slot 0 never; position 6 is prompt
    assert ok[1].tolist() == [False, True, False, False]  # 10, 11 are past the end
    blk = obj.block_inputs(ids, torch.tensor([4, 8]), 4, 16)
    assert blk.tolist() == [[104, 16, 16, 16], [108, 16, 16, 16]]
