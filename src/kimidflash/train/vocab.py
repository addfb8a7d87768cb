"""The softmax over part of the vocabulary, while training only.

The LM head is most of a training step's cost: every counted slot multiplies
its hidden state by the whole (vocabulary x hidden) head, 49,152 rows for
SmolLM2 and 163,840 for Kimi, while a few thousand tokens make up almost all
of the response text. With `train.vocab_subset = N` the softmax of a step runs
over the N tokens most frequent among the training labels *plus every label
in that step's batch*, so each target token is always in its own softmax (no
label is dropped or remapped) and only rare negatives are left out. The
exported drafter is unchanged: vLLM scores it with the target's full, shared
LM head, and the eval phase does too, which is where leaving out rare
negatives would show.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from .data import Record


def frequent_tokens(records: Iterable[Record], n: int) -> torch.Tensor:
    """The `n` most frequent response-token ids (ties broken by the smaller id), sorted by id."""
    if n < 1:
        raise ValueError(f"train.vocab_subset must be at least 1, got {n}")
    counts = Counter(t for r in records for t, m in zip(r.input_ids, r.loss_mask, strict=False) if m)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return torch.tensor(sorted(t for t, _ in top), dtype=torch.long)


def step_vocab(frequent: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The sorted ids one step's softmax runs over: the frequent ones and every label of the batch."""
    return torch.unique(torch.cat([frequent, labels.flatten()]))


def subset_targets(vocab: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each label's index in `vocab` (which holds every label: step_vocab)."""
    idx = torch.searchsorted(vocab, labels)
    if len(labels) and not bool((vocab[idx.clamp(max=len(vocab) - 1)] == labels).all()):
        raise ValueError("a label is missing from the step's vocabulary")
    return idx
