"""Offline acceptance length on crafted cases (fast tier)."""

from __future__ import annotations

import torch

from kimidflash.train.evaluate import acceptance_lengths, eval_anchors, summarize, walk


def test_acceptance_length_is_one_plus_leading_matches():
    truth = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])
    pred = torch.tensor([[5, 6, 7], [5, 0, 7], [0, 6, 7], [5, 6, 0]])
    assert acceptance_lengths(pred, truth).tolist() == [4, 2, 1, 3]


def test_summary_per_position_is_cumulative_like_vllm():
    s = summarize(torch.tensor([4, 2, 1, 3]), 3)
    assert s["mean_acceptance_length"] == 2.5
    assert s["per_position"] == [0.75, 0.5, 0.25]
    assert s["acceptance_rate"] == 0.5
    assert summarize(torch.zeros(0, dtype=torch.long), 3)["mean_acceptance_length"] is None


def test_eval_anchors_need_k_response_tokens_after_them():
    lm = torch.tensor([0, 0, 1, 1, 1, 1, 1, 0, 1])
    assert eval_anchors(lm, 2).tolist() == [2, 3, 4]
    assert eval_anchors(lm, 5).tolist() == []


def test_perfect_drafter_reaches_k_plus_one():
    truth = torch.randint(0, 100, (50, 7))
    assert acceptance_lengths(truth.clone(), truth).float().mean() == 8


def test_walk_drafts_where_a_server_would():
    # anchors 2..9; a draft of length L at a moves the next draft to a + L.
    anchors = torch.arange(2, 10)
    lengths = torch.tensor([1, 4, 9, 9, 9, 2, 9, 1])  # at 2, 3, 4, ... 9
    # 2 (L1) -> 3 (L4) -> 7 (L2) -> 9 (L1) -> 10: not an anchor, the walk ends
    assert walk(anchors, lengths).tolist() == [1, 4, 2, 1]
    assert walk(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)).tolist() == []


def test_walk_mean_is_below_the_anchor_mean_where_failures_cluster():
    # a hard stretch (length 1) and an easy one (length 4): every anchor counts once in
    # the plain mean, but the server drafts at every hard token and once per 4 easy ones
    anchors = torch.arange(0, 40)
    lengths = torch.tensor([1] * 20 + [4] * 20)
    assert lengths.float().mean() == 2.5
    w = walk(anchors, lengths)
    assert w.tolist() == [1] * 20 + [4] * 5
    assert w.float().mean() < 2.0
