"""Distillation against the target's own distribution, from its top-k log-probs.

Cross-entropy on the greedy token teaches the drafter one answer per slot;
the target's distribution also says which other tokens it would nearly have
chosen, which is what a drafter needs to get the next position right more
often (speculators trains DFlash with a KL to the target; SpecForge with CE).
Capture stores, for every position t, the target's top-k token ids and
log-probs of x_t given x_<t (`capture.topk`); `train.distill` then replaces
the cross-entropy of each counted slot with the cross-entropy against that
distribution renormalised over its k tokens. With a one-hot target it is
exactly the cross-entropy on the greedy token (tests/train/test_train_distill.py).

Row t of a stored table predicts token t, the convention of vLLM's
`prompt_logprobs`; row 0 predicts nothing and is never a label (slot 0 of a
block is the anchor itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import CaptureError


@dataclass
class Captured:
    """One sequence as a capture source hands it over: the features, and the
    target's top-k table when capture.topk asks for it."""

    feats: torch.Tensor  # [T, len(layer_ids) * H]
    topk: tuple[torch.Tensor, torch.Tensor] | None = None  # ids [T, k] int32, log-probs [T, k] float16


def soft_cross_entropy(logits: torch.Tensor, target_idx: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    """Per row: -sum_j p_j log q(target_idx_j), p = softmax(target_logp) over the row's k entries.

    logits [R, V] (the drafter's, over V columns), target_idx [R, k] column indices,
    target_logp [R, k] (the target's log-probs; -inf entries get weight 0)."""
    p = torch.softmax(target_logp.float(), dim=-1)
    logq = F.log_softmax(logits.float(), dim=-1).gather(-1, target_idx)
    return -(p * torch.where(p > 0, logq, torch.zeros_like(logq))).sum(-1)


def topk_table(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From next-token logits [T, V] (row t predicts t + 1) to the stored table
    (row t predicts t): ids [T, k] int32, log-probs [T, k] float16; row 0 is empty."""
    logp = F.log_softmax(logits.float(), dim=-1)
    top = logp[:-1].topk(k, dim=-1)
    ids = torch.zeros(logits.shape[0], k, dtype=torch.int32)
    lp = torch.full((logits.shape[0], k), float("-inf"), dtype=torch.float16)
    ids[1:], lp[1:] = top.indices.to(torch.int32), top.values.to(torch.float16)
    lp[0, 0] = 0.0
    return ids, lp


def table_from_prompt_logprobs(
    entries: Sequence[dict[str, Any] | None], k: int, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `prompt_logprobs` (one {token_id: {"logprob": ...}} per position, None
    first) as the stored table, the k most likely tokens of each position."""
    ids = torch.zeros(len(entries), k, dtype=torch.int32)
    lp = torch.full((len(entries), k), float("-inf"), dtype=torch.float16)
    lp[0, 0] = 0.0
    for t, entry in enumerate(entries):
        if t == 0:
            continue
        if not entry:
            raise CaptureError(f"{where}: no prompt_logprobs at position {t}")
        best = sorted(((v["logprob"], int(tok)) for tok, v in entry.items()), reverse=True)[:k]
        if len(best) < k:
            raise CaptureError(f"{where}: {len(best)} prompt_logprobs at position {t}, need capture.topk={k}")
        ids[t] = torch.tensor([tok for _, tok in best], dtype=torch.int32)
        lp[t] = torch.tensor([v for v, _ in best], dtype=torch.float16)
    return ids, lp


def block_targets(
    table: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored rows for block slots at `positions` (clamped into the sequence: rows
    beyond it are never counted)."""
    ids, lp = table
    safe = positions.clamp(max=len(ids) - 1)
    return ids[safe].long(), lp[safe]
