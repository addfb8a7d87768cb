"""Turn captured sequences into one padded training/eval batch for the drafter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from . import objective as obj
from .distill import block_targets


@dataclass
class Batch:
    feats: torch.Tensor  # [N, T, nH]
    block_ids: torch.Tensor  # [N, A*B]
    block_pos: torch.Tensor  # [N, A*B]
    mask: torch.Tensor  # [N, A*B, T + A*B] bool
    labels: torch.Tensor  # [N, A*B]
    label_ok: torch.Tensor  # [N, A*B] bool
    slot: torch.Tensor  # [A*B] slot index 0..B-1
    soft_ids: torch.Tensor | None = None  # [N, A*B, k] the target's top-k ids per slot (train.distill)
    soft_logp: torch.Tensor | None = None  # [N, A*B, k] their log-probs

    def to(self, device: torch.device) -> Batch:
        """Every tensor on `device` (collate builds batches on the CPU)."""
        return Batch(
            *(None if getattr(self, f.name) is None else getattr(self, f.name).to(device) for f in fields(self))
        )


def collate(
    items: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    block_size: int,
    mask_token_id: int,
    tables: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Batch:
    """items: (input_ids, loss_mask, feats, anchors, anchor_valid) per sequence; all share A.
    tables: each sequence's stored top-k table (distill.py), for soft targets per slot."""
    N = len(items)
    T = max(len(it[0]) for it in items)
    A = len(items[0][3])
    B = block_size
    nH = items[0][2].shape[-1]
    # on the features' device: in memory mode they stay on the GPU, padded there, never copied through the CPU
    feats = torch.zeros(N, T, nH, dtype=items[0][2].dtype, device=items[0][2].device)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("ids", "pos", "mask", "lab", "ok")}
    for n, (ids, lm, f, anchors, valid) in enumerate(items):
        L = len(ids)
        feats[n, :L] = f
        ctx_valid = torch.arange(T) < L
        out["ids"].append(obj.block_inputs(ids, anchors, B, mask_token_id).flatten())
        out["pos"].append(obj.block_positions(anchors, B).flatten())
        out["mask"].append(obj.attention_mask(anchors, valid, T, B, ctx_valid))
        lab, ok = obj.block_labels(ids, lm, anchors, valid, B)
        out["lab"].append(lab.flatten())
        out["ok"].append(ok.flatten())
    b = Batch(
        feats,
        torch.stack(out["ids"]),
        torch.stack(out["pos"]),
        torch.stack(out["mask"]),
        torch.stack(out["lab"]),
        torch.stack(out["ok"]),
        torch.arange(B).repeat(A),
    )
    if tables is not None:
        soft = [block_targets(t, p) for t, p in zip(tables, out["pos"], strict=False)]
        b.soft_ids, b.soft_logp = torch.stack([i for i, _ in soft]), torch.stack([lp for _, lp in soft])
    return b
