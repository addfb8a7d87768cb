"""The one writer of vLLM's EAGLE-3 head format (the tiny CPU-reference heads, trained heads).

config.json is the head's JSON as given (the `eagle3.Eagle3Head` it validates to, plus
`torch_dtype`); model.safetensors holds exactly `Eagle3Head.expected_tensors()`: the one
decoder layer under `midlayer.`, `fc.weight`, `norm.weight`, the head's own `lm_head.weight`
over the draft vocabulary and, when that is smaller than the target's, the int64 `d2t`
offsets (target id = draft id + d2t[draft id]). The embedding is the target's and is not
written. Published whole (atomically), so a reader never sees half a head.

Light on purpose (torch only inside the function), as train/export.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..eagle3 import D2T, Eagle3Head
from ..fsio import atomic_dir, make_readable
from .drafter_export import check_names

if TYPE_CHECKING:
    import torch


def export_head(
    state: dict[str, torch.Tensor],
    config: Mapping[str, Any],
    out: Path,
    dtype: str = "bfloat16",
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write the head's config.json + model.safetensors (+ extras) to `out`; `d2t` stays int64."""
    import torch
    from safetensors.torch import save_file

    check_names(
        state, Eagle3Head.from_config(config).expected_tensors(), "EAGLE-3 head state does not match its config"
    )
    td = getattr(torch, dtype)
    tensors = {
        k: (v.detach().to(torch.int64) if k == D2T else v.detach().to(td)).contiguous() for k, v in state.items()
    }
    out = Path(out).resolve()
    with atomic_dir(out) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2, sort_keys=True) + "\n")
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        make_readable(tmp)
    return out
