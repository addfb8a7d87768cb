"""The fixed part of a DFlash step's cost, from the weights a step reads.

The advisor's step cost is `1 + draft + verify * k` against a plain decode
step. One run and its baseline fix one unknown, so the other must come from
somewhere. Fitted to the seed's two MI300X outcomes the drafting part came
out 0, and on the CPU reference that made every prediction too kind to small
k: fitted to every measured k, the fixed part is 0.33 to 0.53 of a decode
step there (benchmarks/sweep/cpu-reference). A DFlash drafter drafts its
whole block in one forward, so its cost hardly grows with k; at the loads
where decoding is bound by memory, that forward costs about what it reads.
So the fixed part is taken as the bytes one draft step reads over the bytes
one target decode step reads, from the safetensors headers alone:

- the drafter: all its tensors, plus the target's LM head, which it shares and
  applies to its block (its embedding rows are a lookup, not a read), unless
  it has a head of its own (a draft vocabulary: train/draft_vocab.py), which
  is then among its tensors;
- the target at batch size b: every text-model tensor but the embedding (a
  lookup) and, of the routed experts, the share b tokens can touch:
  min(1, b x num_experts_per_tok / n_routed_experts) (an upper bound on what a
  batch reads; the vision tower of a multimodal checkpoint is not read).

Then the per-token part is fitted to the run, as before.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint_layout import LayoutError, locate, read_config, text_field, weight_map
from ..formats.drafter_export import DRAFT_HEAD
from ..safetensors_io import SafetensorsError, read_header

FLOATS = {"F32", "BF16", "F16"}
SERVED_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # DTYPE -> bytes a float weight is served in


def tensor_bytes(model_dir: str | Path, dtype: str = "auto", wm: dict[str, str] | None = None) -> dict[str, int]:
    """Tensor name -> bytes as served: stored bytes, or for a float tensor under a DTYPE that casts it
    (float32 serving upcasts a bfloat16 drafter), its elements at that DTYPE's size."""
    d = Path(model_dir)
    wm = weight_map(d) if wm is None else wm
    cast = SERVED_BYTES.get(dtype)
    out: dict[str, int] = {}
    for shard in sorted(set(wm.values())):
        try:
            header = read_header(d / shard)
        except SafetensorsError as exc:
            raise LayoutError(str(exc)) from None
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for n in meta["shape"]:
                numel *= n
            stored = meta["data_offsets"][1] - meta["data_offsets"][0]
            out[name] = numel * cast if cast and meta["dtype"] in FLOATS else stored
    return out


def target_step_bytes(model_dir: str | Path, batch: int, dtype: str = "auto") -> tuple[int, int]:
    """(bytes a target decode step at this batch size reads, bytes of its LM head)."""
    layout, wm = locate(model_dir)
    sizes = tensor_bytes(model_dir, dtype, wm)
    cfg = read_config(model_dir)
    routed, per_token = text_field(cfg, "n_routed_experts"), text_field(cfg, "num_experts_per_tok")
    share = min(1.0, batch * per_token / routed) if routed and per_token else 1.0
    total = 0.0
    for name, b in sizes.items():
        if name == layout.embed and not layout.tied:
            continue  # a lookup
        if not (name.startswith(layout.prefix) or name == layout.head):
            continue  # outside the text model: a vision tower, a projector
        total += b * share if ".experts." in name else b
    return int(total), sizes[layout.head]


def fixed_draft_cost(target_dir: str | Path, drafter_dir: str | Path, batch: int, dtype: str = "auto") -> float:
    """A draft step's reads over a target step's at this batch size, both served at DTYPE `dtype`
    (LayoutError when a checkpoint is missing)."""
    target, head = target_step_bytes(target_dir, batch, dtype)
    own = tensor_bytes(drafter_dir, dtype)
    drafter = sum(own.values()) + (0 if DRAFT_HEAD in own else head)
    return round(drafter / target, 4)
