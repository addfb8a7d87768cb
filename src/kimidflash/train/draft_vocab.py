"""A drafter's own, smaller LM head: the draft vocabulary (as in FR-Spec, and EAGLE-3's `d2t`).

Why: a decode step at small batch is bound by reading weights, and most of
what a DFlash draft step reads is its LM head. SmolLM2's drafter shares the
target's 49,152 x 576 head (113 MB in float32) against about 35 MB for its
`fc` and two layers, so the head is three quarters of the draft's fixed cost,
which on a CPU is what decides whether speculation pays. A head over N
tokens reads N/49,152 of that.

vLLM's DFlash loader takes it as it takes EAGLE-3's: `draft_vocab_size: N`
in config.json, an N-row `lm_head.weight`, and `d2t[i]` = (target id of
draft token i) - i. It scatters the N logits back into the target's
vocabulary, so a draft can only propose one of the N tokens; the target still
verifies every token, so outputs do not change, only acceptance can.

Which N: the `frequent` share by how often the target says each token in the
training records' answers (what the drafter learned to predict), the rest by
token id, lowest first. A BPE tokenizer numbers its merges in the order it
learned them, by frequency in its own (much larger) corpus, so low ids are a
prior that holds beyond our training data. (On held-out prompts people wrote
the share barely moved coverage; the size is what matters.) The rows are the
target's own head rows, as stored, so a drafted token scores exactly as it
would through the shared head.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..checkpoint_layout import require_config
from ..errors import TrainConfigError
from ..formats.drafter_export import DRAFT_D2T, DRAFT_HEAD
from ..fsio import atomic_dir, make_readable, sha256_file, utc_now
from ..paths import portable
from .data import Record
from .target_weights import read_tensors, target_layout
from .vocab import frequent_tokens

MANIFEST = "draft-vocab.json"
FREQUENT = 0.5  # the share of the tokens chosen by frequency in the records, by default


def choose(records: list[Record], size: int, vocab_size: int, frequent: float = FREQUENT) -> torch.Tensor:
    """The sorted target ids of a `size`-token draft vocabulary (see the module docstring)."""
    if not 0 < size <= vocab_size:
        raise TrainConfigError(f"draft vocabulary size {size}: must be in 1..{vocab_size} (the target's vocabulary)")
    if not 0.0 <= frequent <= 1.0:
        raise TrainConfigError(f"draft vocabulary frequent share {frequent}: must be in 0..1")
    n_freq = round(size * frequent)
    picked = set(frequent_tokens(records, n_freq).tolist()) if n_freq else set()
    for t in range(vocab_size):
        if len(picked) >= size:
            break
        picked.add(t)
    return torch.tensor(sorted(picked), dtype=torch.long)


def rule(frequent: float, records: str) -> str:
    """How `choose` picked the tokens, as the manifest records it."""
    return f"{frequent:g} of the tokens by answer-token frequency in {records}, the rest lowest ids first"


def coverage(records: Iterable[Record], ids: torch.Tensor) -> float | None:
    """The share of the records' answer tokens that are in `ids`."""
    keep = set(ids.tolist())
    labels = [t for r in records for t, m in zip(r.input_ids, r.loss_mask, strict=False) if m]
    return round(sum(t in keep for t in labels) / len(labels), 4) if labels else None


def attach(
    drafter_dir: str | Path, model_dir: str | Path, ids: torch.Tensor, out: str | Path, provenance: dict[str, Any]
) -> Path:
    """A copy of `drafter_dir` at `out` whose head is the target's rows `ids`, published whole."""
    from safetensors.torch import load_file, save_file

    src = Path(drafter_dir)
    cfg = require_config(src, "drafter", TrainConfigError)
    if cfg.get("draft_vocab_size") not in (None, cfg.get("vocab_size")):
        raise TrainConfigError(f"{src}: already has a draft vocabulary ({cfg['draft_vocab_size']} tokens)")
    layout, weight_map = target_layout(model_dir)
    head = read_tensors(model_dir, weight_map, [layout.head], float32=False)[layout.head]
    if head.shape[0] != cfg["vocab_size"] or head.shape[1] != cfg["hidden_size"]:
        raise TrainConfigError(
            f"{model_dir}: head {list(head.shape)} does not fit {src}/config.json "
            f"(vocab_size {cfg['vocab_size']}, hidden_size {cfg['hidden_size']})"
        )
    tensors = load_file(str(src / "model.safetensors"))
    tensors[DRAFT_HEAD] = head[ids].contiguous()
    tensors[DRAFT_D2T] = ids - torch.arange(len(ids))
    cfg.update(draft_vocab_size=len(ids), tie_word_embeddings=False)
    manifest = {
        "tokens": len(ids),
        "of": cfg["vocab_size"],
        "from_drafter": portable(src),
        "drafter_weights_sha256": sha256_file(src / "model.safetensors"),
        "target": portable(model_dir),
        "utc": utc_now(),
        **provenance,
    }
    with atomic_dir(Path(out).resolve()) as tmp:
        for p in src.iterdir():
            if p.is_file() and p.name not in ("config.json", "model.safetensors", MANIFEST, "offline-acceptance.json"):
                shutil.copy2(p, tmp / p.name)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        make_readable(tmp)
    return Path(out)


def draft_vocab_ids(drafter_dir: str | Path) -> torch.Tensor | None:
    """The target ids of an exported drafter's draft vocabulary (from its `d2t`), or None when it
    scores the whole vocabulary through the target's head."""
    from safetensors import safe_open

    weights = Path(drafter_dir) / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        names = set(f.keys())
        if not names & {DRAFT_HEAD, DRAFT_D2T}:
            return None
        if not {DRAFT_HEAD, DRAFT_D2T} <= names:
            raise TrainConfigError(f"{weights}: a draft vocabulary needs both {DRAFT_HEAD} and {DRAFT_D2T}")
        d2t = f.get_tensor(DRAFT_D2T).long()
    return d2t + torch.arange(len(d2t))
