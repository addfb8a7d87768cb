"""The one writer of vLLM's DFlash checkpoint format (trained drafters and the tiny CPU-reference one).

config.json: `architectures: ["DFlashDraftModel"]`, `model_type: qwen3` with
the usual Qwen3 fields (vocab equal to the target's), `block_size`,
`num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`, no
`layer_types` (vLLM 0.32's loader would read it as per-layer attention
types); DrafterShape.vllm_config writes it. model.safetensors: unprefixed
`fc.weight`, `hidden_norm.weight`, `layers.N.*`, `norm.weight`; the
embeddings and LM head are the target's and are not written. The mask token
is a real vocabulary id whose embedding the drafter learns to read as
"unknown slot" (SmolLM2: 16 `<empty_output>`, never produced in normal text;
Kimi: a reserved id, see the Kimi drafter JSON).

Light on purpose (torch only inside the function): the CPU reference's
generator imports it, and serving imports that generator's `is_current`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainConfigError
from ..fsio import atomic_dir, make_readable
from .drafter import DrafterShape

if TYPE_CHECKING:
    import torch

# A drafter with a draft vocabulary (draft_vocab.py) also holds its own head and the draft-to-target id
# offsets, under the names vLLM's DFlash loader reads.
DRAFT_HEAD = "lm_head.weight"
DRAFT_D2T = "d2t"


def expected_tensors(shape: DrafterShape | dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every exported name and its shape, from the drafter JSON alone."""
    return DrafterShape.coerce(shape).expected_tensors()


def check_state(state: dict[str, torch.Tensor], shape: DrafterShape) -> None:
    check_names(state, shape.expected_tensors(), "drafter state does not match its shape")


def check_names(state: dict[str, torch.Tensor], want: dict[str, tuple[int, ...]], what: str) -> None:
    """Refuse a state whose names and shapes are not exactly `want`, naming the first few that differ
    (the one check both writers, DFlash and EAGLE-3, make before they write)."""
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise TrainConfigError(f"{what}: missing {missing[:3]}, extra {extra[:3]}, wrong shape {wrong[:3]}")


def export_model(
    state: dict[str, torch.Tensor],
    shape: DrafterShape | dict[str, Any],
    out: Path,
    dtype: str = "bfloat16",
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write config.json + model.safetensors (+ extras) to `out`, published whole (atomically)."""
    import torch
    from safetensors.torch import save_file

    shape = DrafterShape.coerce(shape)
    check_state(state, shape)
    td = getattr(torch, dtype)
    tensors = {k: v.detach().to(td).contiguous() for k, v in state.items()}
    out = Path(out).resolve()
    with atomic_dir(out) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(shape.vllm_config(dtype), indent=2, sort_keys=True) + "\n")
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        make_readable(tmp)
    return out
