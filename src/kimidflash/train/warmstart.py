"""Start the draft layers from the target's own decoder layers (`train.init_from_target`).

A drafter whose layers have the target's shape (SmolLM2's drafter: hidden
576, 9 heads, 3 KV heads, MLP 1536, exactly a SmolLM2 layer) can begin from
weights that already read and write the target's residual stream, instead of
from noise. Draft layer i gets target layer `init_from_target[i]`: the q/k/v/o
projections, the MLP and both layer norms. The drafter's per-head q/k norms
have no counterpart in a Llama layer and stay at one; `fc`, `hidden_norm` and
the final norm stay as initialised. A target whose layers differ in shape (an
MLA target such as Kimi, whose attention has no q/k/v projections) is
refused with the tensor that does not fit.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import TrainConfigError
from .shape import DrafterShape

# Drafter parameter (after "layers.N.") -> the target's name (after "model.layers.L.").
COPIED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
          "input_layernorm.weight", "post_attention_layernorm.weight")


def target_layer_tensors(model_dir: str | Path, layer_ids: list[int], shape: DrafterShape) -> dict[str, torch.Tensor]:
    """The drafter state-dict entries copied from the target, float32, each checked against the shape's own."""
    from safetensors import safe_open

    if len(layer_ids) != shape.num_hidden_layers:
        raise TrainConfigError(f"train.init_from_target lists {len(layer_ids)} target layers; the drafter has "
                               f"{shape.num_hidden_layers} (one target layer per draft layer)")
    wanted = {f"model.layers.{L}.{name}": f"layers.{i}.{name}" for i, L in enumerate(layer_ids) for name in COPIED}
    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in set(f.keys()) & wanted.keys():
                out[wanted[key]] = f.get_tensor(key).float()
    expected = shape.expected_tensors()
    missing = [k for k, v in wanted.items() if v not in out]
    if missing:
        raise TrainConfigError(f"train.init_from_target: the target at {model_dir} has no {missing[0]} "
                               "(only a target whose layers have the drafter's shape can seed it)")
    for name in wanted.values():  # in layer, then COPIED order: the first misfit is named
        t = out[name]
        if tuple(t.shape) != expected[name]:
            raise TrainConfigError(f"train.init_from_target: target tensor for {name} is {list(t.shape)}, the "
                                   f"drafter's is {list(expected[name])}")
    return out
