"""The DFlash training objective: anchors, blocks, the attention mask, loss weights.

Definitions (see docs/drafter-training.md for the equations):

* A sequence of T tokens x_0..x_{T-1} has a loss mask m_t (1 on response tokens).
* An *anchor* a is a position with m_a = 1 and a + 1 < T. Its *block* is B
  consecutive positions a..a+B-1 whose inputs are the token x_a at slot 0
  followed by B-1 copies of the mask token (slots 1..B-1).
* The context is the target's hidden states at every position. A query in
  the block of anchor a may attend to context positions j < a (strictly
  before the anchor: at serving time the target has not processed x_a yet)
  and to all B slots of its own block (bidirectional), nothing else.
* Slot k (1 <= k < B) predicts x_{a+k}; it counts only if a + k < T and
  m_{a+k} = 1. Its weight is exp(-(k-1)/gamma): early slots decide how far
  acceptance gets, so they weigh most. Slot 0 is the anchor itself: no loss.
"""

from __future__ import annotations

import math

import torch


def loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight per slot 0..B-1; slot 0 gets 0."""
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    w = [0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]
    return torch.tensor(w, dtype=torch.float32)


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with loss_mask[a] == 1 and a + 1 < T (a token to predict exists)."""
    m = loss_mask.clone().bool()
    m[-1:] = False
    return torch.nonzero(m, as_tuple=False).flatten()


def sample_anchors(loss_mask: torch.Tensor, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` anchors drawn without replacement where the mask holds, sorted, and a validity flag.

    Fewer candidates than `n`: the rest are padding (position 0, valid=False)."""
    cand = anchor_candidates(loss_mask)
    anchors = torch.zeros(n, dtype=torch.long)
    valid = torch.zeros(n, dtype=torch.bool)
    if len(cand):
        k = min(n, len(cand))
        pick = cand[torch.randperm(len(cand), generator=gen)[:k]].sort().values
        anchors[:k] = pick
        valid[:k] = True
    return anchors, valid


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[A, B] token ids: the anchor's token, then mask tokens."""
    blk = torch.full((len(anchors), block_size), mask_token_id, dtype=torch.long)
    blk[:, 0] = input_ids[anchors]
    return blk


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[A, B] absolute positions a..a+B-1 (RoPE positions of the block slots)."""
    return anchors[:, None] + torch.arange(block_size)[None, :]


def block_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[A, B] label ids (x_{a+k}) and [A, B] bool: counts in the loss (k >= 1, in range, mask 1, anchor valid)."""
    T = len(input_ids)
    pos = block_positions(anchors, block_size)
    inside = pos < T
    safe = pos.clamp(max=T - 1)
    labels = torch.where(inside, input_ids[safe], torch.zeros_like(safe))
    ok = inside & loss_mask[safe].bool() & anchor_valid[:, None]
    ok[:, 0] = False
    return labels, ok


def attention_mask(
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    context_len: int,
    block_size: int,
    context_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bool [A*B, T + A*B]: True where a block query may attend.

    Keys are the T context positions followed by the A*B block slots (block-major).
    Padding anchors still see their own block so no row is empty (their loss is 0)."""
    A, B, T = len(anchors), block_size, context_len
    pos = torch.arange(T)
    ctx = pos[None, :] < anchors[:, None]  # [A, T]: strictly before the anchor
    if context_valid is not None:
        ctx = ctx & context_valid[None, :]
    ctx = ctx & anchor_valid[:, None]
    ctx = ctx.repeat_interleave(B, dim=0)  # [A*B, T]
    blk_id = torch.arange(A).repeat_interleave(B)
    own = blk_id[:, None] == blk_id[None, :]  # [A*B, A*B]
    return torch.cat([ctx, own], dim=1)


def brute_force_mask(
    anchors: list[int],
    anchor_valid: list[bool],
    context_len: int,
    block_size: int,
    context_valid: list[bool] | None = None,
) -> list[list[bool]]:
    """The same mask written as loops straight from the definition (for tests)."""
    rows = []
    for a_i, a in enumerate(anchors):
        for _s in range(block_size):
            row = []
            for j in range(context_len):
                ok = j < a and anchor_valid[a_i] and (context_valid is None or context_valid[j])
                row.append(ok)
            for b_i in range(len(anchors)):
                for _t in range(block_size):
                    row.append(b_i == a_i)
            rows.append(row)
    return rows
