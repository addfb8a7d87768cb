"""The target's tensors the drafter shares (embedding, LM head) or starts from (decoder layers).

Names come from checkpoint_layout, read from the safetensors headers (or the
shard index) without loading anything; only the chosen tensors are then read,
each from its own shard. Why it matters: Kimi K2.6's head is
`language_model.lm_head.weight`, and a reader that looked for `lm_head.weight`
only fell back to the embedding without a word, so the drafter learned to
predict through the wrong matrix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch

from ..checkpoint_layout import LayoutError, TextLayout, locate
from ..errors import TrainConfigError


def target_layout(model_dir: str | Path) -> tuple[TextLayout, dict[str, str]]:
    """The target's text layout and weight map; a checkpoint that has none is a TrainConfigError."""
    try:
        return locate(model_dir)
    except LayoutError as exc:
        raise TrainConfigError(f"target checkpoint: {exc}") from None


def read_tensors(
    model_dir: str | Path, weight_map: dict[str, str], names: Iterable[str], float32: bool = True
) -> dict[str, torch.Tensor]:
    """The named tensors, each read from the shard the weight map gives it: as float32, or with
    `float32=False` as stored (what a bit-for-bit comparison or a dtype-keeping export needs)."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_file[weight_map[name]].append(name)
    out: dict[str, torch.Tensor] = {}
    for fname, wanted in sorted(by_file.items()):
        with safe_open(str(Path(model_dir) / fname), "pt") as f:
            for name in wanted:
                t = f.get_tensor(name)
                out[name] = t.float() if float32 else t
    return out


def load_target_head(model_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM head (the embedding itself when tied), float32."""
    lay, wm = target_layout(model_dir)
    got = read_tensors(model_dir, wm, {lay.embed, lay.head})
    return got[lay.embed], got[lay.head]
