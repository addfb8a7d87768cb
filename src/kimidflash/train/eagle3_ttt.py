"""The EAGLE-3 training objective: training-time test (TTT) over several draft steps.

What serving does (eagle3_model.py) decides the objective. For a sequence x_0..x_{T-1} with
the target's auxiliary features F_i and a response mask m:

* Step 0, row i: token x_{i+1}, hidden fc(F_i), position i; attends causally to step 0's rows
  0..i (the head's KV cache holds step 0 for every verified position).
* Step j >= 1, row i: token x_{i+1+j} (teacher-forced: a draft is only accepted as far as it
  equals these), hidden = step j-1's output at row i, position i + j; attends to step 0's
  rows 0..i and to its own row's steps 1..j, which is what a draft step reads from the cache
  when row i was the last verified position.
* Row i at step j predicts x_{i+2+j}. It counts when that token exists, is a response token
  and is in the draft vocabulary, and when x_{i+1} is a response token (a server drafts from
  response positions: the first draft row is the one holding the first answer token). Step
  j weighs exp(-j / gamma): early steps decide how far a draft gets accepted.

Anchors in eval.py's sense (a DFlash block's first token x_a) are row a - 1 here: both draft
x_{a+1}.. after the target emitted x_a.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .eagle3_model import Eagle3Drafter


def step_mask(T: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [T, T * (1 + step)]: row i of step `step` may read step 0's rows 0..i, then its own row
    of steps 1..step (key blocks in that order)."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def brute_force_step_mask(T: int, step: int) -> list[list[bool]]:
    """The same mask from the definition, as loops (for tests)."""
    return [[(c <= i) if blk == 0 else (c == i) for blk in range(step + 1) for c in range(T)] for i in range(T)]


def shifted(tokens: torch.Tensor, by: int) -> torch.Tensor:
    """[N, T] ids moved left by `by` (row i gets x_{i+by}), zeros past the end."""
    out = torch.zeros_like(tokens)
    if by < tokens.shape[1]:
        out[:, : tokens.shape[1] - by] = tokens[:, by:]
    return out


def ttt_forward(model: Eagle3Drafter, tokens: torch.Tensor, feats: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Final-normed hidden states [N, T, H] of each step 0..steps-1 (row i as the module docstring says)."""
    attn = model.midlayer.self_attn
    N, T = tokens.shape
    pos = torch.arange(T, device=tokens.device).expand(N, T)
    g = model.fc(feats.to(model.fc.weight.dtype))
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    out: list[torch.Tensor] = []
    for j in range(steps):
        x, residual = model.layer_input(shifted(tokens, 1 + j), g)
        q, k, v = attn.qkv(x, pos + j)
        keys.append(k)
        values.append(v)
        o = F.scaled_dot_product_attention(
            q, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=step_mask(T, j, tokens.device), scale=attn.scale
        )
        final, g = model.finish(attn.out(o), residual)
        out.append(final)
    return out


def step_labels(
    tokens: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, steps: int, t2d: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per step: [N, T] draft-vocabulary labels and [N, T] bool, where the row counts (docstring).
    `t2d`: target id -> draft column or -1 (None: the draft vocabulary is the target's)."""
    N, T = tokens.shape
    rows = torch.arange(T, device=tokens.device)[None, :]
    drafting = shifted(loss_mask, 1).bool() & (rows + 1 < lengths[:, None])
    labels, ok = [], []
    for j in range(steps):
        truth = shifted(tokens, 2 + j)
        inside = rows + 2 + j < lengths[:, None]
        col = truth if t2d is None else t2d[truth]
        counted = drafting & inside & shifted(loss_mask, 2 + j).bool() & (col >= 0)
        labels.append(col.clamp(min=0))
        ok.append(counted)
    return labels, ok


def step_weights(steps: int, gamma: float) -> list[float]:
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    return [math.exp(-j / gamma) for j in range(steps)]


def ttt_loss(
    model: Eagle3Drafter,
    tokens: torch.Tensor,
    loss_mask: torch.Tensor,
    lengths: torch.Tensor,
    feats: torch.Tensor,
    steps: int,
    gamma: float,
    t2d: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy over every counted (row, step), averaged by weight; acc per step."""
    hidden = ttt_forward(model, tokens, feats, steps)
    labels, ok = step_labels(tokens, loss_mask, lengths, steps, t2d)
    total = hidden[0].sum() * 0.0
    weight = 0.0
    info: dict[str, float] = {"tokens": 0.0}
    weights = step_weights(steps, gamma)
    for j, (h, lab, sel) in enumerate(zip(hidden, labels, ok, strict=False)):
        if not sel.any():
            info[f"acc{j}"] = float("nan")
            continue
        logits = model.logits(h[sel]).float()
        ce = F.cross_entropy(logits, lab[sel], reduction="sum")
        w = weights[j]
        total = total + w * ce
        weight += w * float(sel.sum())
        info["tokens"] += float(sel.sum())
        with torch.no_grad():
            info[f"acc{j}"] = float((logits.argmax(-1) == lab[sel]).float().mean())
    return (total / weight if weight else total), info


@torch.no_grad()
def draft_chains(model: Eagle3Drafter, tokens: torch.Tensor, feats: torch.Tensor, k: int) -> torch.Tensor:
    """[N, T, k] greedy drafts (target ids) of every row at steps 0..k-1, teacher-forced (exact for
    the leading run of correct drafts, which is all acceptance counts)."""
    return torch.stack([model.predict(h) for h in ttt_forward(model, tokens, feats, k)], dim=-1)
