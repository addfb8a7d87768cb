"""Start a drafter from weights that already work, instead of from noise.

`train.init_from_target`: draft layers from the target's own decoder layers.

A drafter whose layers have the target's shape (SmolLM2's drafter: hidden
576, 9 heads, 3 KV heads, MLP 1536, exactly a SmolLM2 layer) can begin from
weights that already read and write the target's residual stream, instead of
from noise. Draft layer i gets target layer `init_from_target[i]`: the q/k/v/o
projections, the MLP and both layer norms. The drafter's per-head q/k norms
have no counterpart in a Llama layer and stay at one; `fc`, `hidden_norm` and
the final norm stay as initialised. A target whose layers differ in shape (an
MLA target such as Kimi, whose attention has no q/k/v projections) is
refused with the tensor that does not fit.

`train.init_from_drafter`: every tensor of a drafter this pipeline exported
(a shipped one, say), so a new run goes on from what that one learned, with
more data, another schedule or more layers. A drafter with more layers than
its source grows: the source's layers come first, and each new layer starts
with its output projections (`o_proj`, `down_proj`) at zero, so it adds
nothing to the residual stream and the grown drafter computes exactly what
its source did at step 0 (tested); its other weights come from
`init_from_target` when that is set, else from noise, and training opens the
new layers up. Only the optimizer state is new: an export keeps none.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint_layout import require_config
from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape
from ..formats.drafter_export import DRAFT_D2T, DRAFT_HEAD
from .target_weights import read_tensors, target_layout

# Drafter parameter (after "layers.N.") -> the target's name (after its "<prefix>layers.L.").
COPIED = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def target_layer_tensors(model_dir: str | Path, layer_ids: list[int], shape: DrafterShape) -> dict[str, torch.Tensor]:
    """The drafter state-dict entries copied from the target, float32, each checked against the shape's own.

    The target's layers are found where checkpoint_layout puts its text model (`model.layers.L.` for
    Llama, `language_model.model.layers.L.` for Kimi K2.6)."""
    if len(layer_ids) != shape.num_hidden_layers:
        raise TrainConfigError(
            f"train.init_from_target lists {len(layer_ids)} target layers; the drafter has "
            f"{shape.num_hidden_layers} (one target layer per draft layer)"
        )
    lay, wm = target_layout(model_dir)
    wanted = {f"{lay.layer(L)}{name}": f"layers.{i}.{name}" for i, L in enumerate(layer_ids) for name in COPIED}
    missing = [k for k in wanted if k not in wm]
    if missing:
        raise TrainConfigError(
            f"train.init_from_target: the target at {model_dir} has no {missing[0]} "
            "(only a target whose layers have the drafter's shape can seed it)"
        )
    out = {wanted[k]: t for k, t in read_tensors(model_dir, wm, wanted).items()}
    expected = shape.expected_tensors()
    for name in wanted.values():  # in layer, then COPIED order: the first misfit is named
        t = out[name]
        if tuple(t.shape) != expected[name]:
            raise TrainConfigError(
                f"train.init_from_target: target tensor for {name} is {list(t.shape)}, the "
                f"drafter's is {list(expected[name])}"
            )
    return out


# A source drafter's config keys that must equal the new drafter's: its tensors mean something only
# for the same features (target layers), the same mask token and the same layer geometry.
SAME_AS_SOURCE = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
SILENT_AT_START = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def drafter_tensors(drafter_dir: str | Path, shape: DrafterShape) -> dict[str, torch.Tensor]:
    """An exported drafter's tensors (float32) as this drafter's initial state, grown when it has more layers.

    The source must describe the same features (target layers, mask token) and layer geometry and have
    at most as many layers; every disagreement is refused naming the key or tensor."""
    from safetensors.torch import load_file

    d = Path(drafter_dir)
    weights = d / "model.safetensors"
    if not weights.is_file():
        raise TrainConfigError(
            f"train.init_from_drafter: {d} has no model.safetensors (a drafter exported by "
            "the export phase is expected)"
        )
    src = DrafterShape.from_dict(
        require_config(d, "train.init_from_drafter config", TrainConfigError), str(d / "config.json")
    )
    for key in SAME_AS_SOURCE:
        if getattr(src, key) != getattr(shape, key):
            raise TrainConfigError(
                f"train.init_from_drafter: {key} is {getattr(src, key)} in {src.source}, "
                f"{getattr(shape, key)} in {shape.source}"
            )
    for key in ("target_layer_ids", "mask_token_id"):
        if getattr(src, key) != getattr(shape, key):
            raise TrainConfigError(
                f"train.init_from_drafter: dflash_config.{key} is {getattr(src, key)} in "
                f"{src.source}, {getattr(shape, key)} in {shape.source}"
            )
    if src.num_hidden_layers > shape.num_hidden_layers:
        raise TrainConfigError(
            f"train.init_from_drafter: {src.source} has {src.num_hidden_layers} layers, the "
            f"drafter {shape.num_hidden_layers}; a drafter can grow from its source, not shrink"
        )
    # A draft vocabulary's head is the target's rows (draft_vocab.py), not something the drafter learned.
    out = {k: v.float() for k, v in load_file(str(weights)).items() if k not in (DRAFT_HEAD, DRAFT_D2T)}
    want = src.expected_tensors()
    for name, size in want.items():
        if name not in out:
            raise TrainConfigError(f"train.init_from_drafter: {weights} has no {name}")
        if tuple(out[name].shape) != size:
            raise TrainConfigError(
                f"train.init_from_drafter: {weights}: {name} is {list(out[name].shape)}, expected {list(size)}"
            )
    extra = sorted(set(out) - set(want))
    if extra:
        raise TrainConfigError(
            f"train.init_from_drafter: {weights} holds {extra[0]}, which a drafter of "
            f"{src.source}'s shape does not have"
        )
    sizes = shape.expected_tensors()
    for i in range(src.num_hidden_layers, shape.num_hidden_layers):
        for name in SILENT_AT_START:
            out[f"layers.{i}.{name}"] = torch.zeros(sizes[f"layers.{i}.{name}"])
    return out
