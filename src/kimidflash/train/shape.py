"""The drafter's shape: one validated, frozen object made once from the drafter JSON.

The same JSON (configs/smollm2-dflash-draft.json, configs/kimi-k2.6-dflash-draft.json)
says what serving loads and what training builds, so every derived number
lives here and nowhere else: the model, capture, the trainer, eval, export and
the tiny CPU-reference drafter all read these properties instead of digging
in the dict. A leaf (no torch): a shape can be checked before anything heavy
is imported.

Rope theta, one precedence: `rope_parameters.rope_theta` (the newer
transformers field) and `rope_theta` (the older one) name the same number. A
shape may carry either, or both when they agree; both with different values is
refused, because training would use one and the exported config would tell
vLLM the other. Neither: 1e6, Qwen3's default.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TrainConfigError

DEFAULT_ROPE_THETA = 1000000.0
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "block_size", "dflash_config")
# Keys of the drafter JSON that describe training, or that vLLM 0.32's DFlash loader
# would misread (`layer_types` as per-layer attention types): never exported.
NOT_EXPORTED = ("training", "layer_types")
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")


def read_json_file(path: Path, what: str) -> Any:
    """A training JSON file (the options, a drafter shape), or one line naming it."""
    if not path.is_file():
        raise TrainConfigError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TrainConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None


def _rope_theta(raw: dict[str, Any], source: str) -> float:
    top = raw.get("rope_theta")
    nested = (raw.get("rope_parameters") or {}).get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise TrainConfigError(f"{source}: rope_theta {top} and rope_parameters.rope_theta {nested} differ; "
                               "keep one, or make them equal")
    value = nested if nested is not None else top
    return float(value) if value is not None else DEFAULT_ROPE_THETA


def check_layer_ids(ids: "list[int] | tuple[int, ...]", num_hidden_layers: int, source: str) -> None:
    """Layer ids must lie in 0..n-2: HF's last hidden state is after the final norm, vLLM's is not,
    so a drafter trained on the last layer would be served other features than it learned from."""
    if min(ids) < 0 or max(ids) >= num_hidden_layers - 1:
        raise TrainConfigError(f"{source}: target_layer_ids {list(ids)} must lie in 0..{num_hidden_layers - 2} "
                               f"(never the last layer, {num_hidden_layers - 1}: its HF hidden state is after "
                               "the final norm, vLLM's is not)")


@dataclass(frozen=True)
class DrafterShape:
    """The drafter JSON, checked, with the numbers derived from it.

    `raw` is the JSON as written (what the manifest and the checkpoint record);
    indexing a shape (`shape["block_size"]`) reads it, so code that treats the
    shape as the JSON it came from keeps working.
    """

    raw: dict[str, Any] = field(repr=False)
    source: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    attention_bias: bool
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None

    @classmethod
    def load(cls, path: str | Path) -> "DrafterShape":
        p = Path(path)
        return cls.from_dict(read_json_file(p, "drafter_config"), str(p))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "drafter shape") -> "DrafterShape":
        for key in REQUIRED:
            if key not in raw:
                raise TrainConfigError(f"{source}: missing '{key}'")
        dc = raw["dflash_config"]
        ids = dc.get("target_layer_ids")
        if not ids:
            raise TrainConfigError(f"{source}: dflash_config.target_layer_ids is empty")
        if "mask_token_id" not in dc:
            raise TrainConfigError(f"{source}: missing 'dflash_config.mask_token_id'")
        H, nh = raw["hidden_size"], raw["num_attention_heads"]
        shape = cls(raw=copy.deepcopy(raw), source=source, hidden_size=H, num_hidden_layers=raw["num_hidden_layers"],
                    num_attention_heads=nh, num_key_value_heads=raw["num_key_value_heads"],
                    intermediate_size=raw["intermediate_size"], vocab_size=raw["vocab_size"],
                    block_size=raw["block_size"], head_dim=raw.get("head_dim") or H // nh,
                    rope_theta=_rope_theta(raw, source), rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
                    attention_bias=raw.get("attention_bias", False), mask_token_id=dc["mask_token_id"],
                    target_layer_ids=tuple(ids), num_target_layers=raw.get("num_target_layers"))
        if shape.num_target_layers is not None:
            shape.check_target(shape.num_target_layers)
        return shape

    @classmethod
    def coerce(cls, shape: "DrafterShape | dict[str, Any]") -> "DrafterShape":
        """A shape as given, or made from its JSON dict (a checkpoint records the dict)."""
        return shape if isinstance(shape, DrafterShape) else cls.from_dict(shape)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (a copy): what checkpoints and manifests store."""
        return copy.deepcopy(self.raw)

    def check_target(self, num_hidden_layers: int) -> None:
        """Refuse layer ids the target lacks, and its last layer (see check_layer_ids)."""
        check_layer_ids(self.target_layer_ids, num_hidden_layers, self.source)

    def with_block_size(self, block_size: int) -> "DrafterShape":
        """The same drafter served with another number of queries per draft step."""
        return DrafterShape.from_dict({**self.raw, "block_size": block_size}, self.source)

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor vLLM's DFlash loader reads and its shape: unprefixed, no embeddings or LM head
        (the target's are shared)."""
        H, hd, I = self.hidden_size, self.head_dim, self.intermediate_size
        nh, nkv, n = self.num_attention_heads, self.num_key_value_heads, len(self.target_layer_ids)
        out: dict[str, tuple[int, ...]] = {"fc.weight": (H, n * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
        per = dict(zip(LAYER_TENSORS, ((nh * hd, H), (nkv * hd, H), (nkv * hd, H), (H, nh * hd), (hd,), (hd,),
                                       (I, H), (I, H), (H, I), (H,), (H,))))
        for i in range(self.num_hidden_layers):
            for k, s in per.items():
                out[f"layers.{i}.{k}"] = s
        return out

    def vllm_config(self, dtype: str) -> dict[str, Any]:
        """config.json of the exported drafter: the shape's own keys, both rope fields set to the one
        theta, `DFlashDraftModel` on `model_type: qwen3`."""
        cfg = {k: copy.deepcopy(v) for k, v in self.raw.items() if k not in NOT_EXPORTED}
        cfg["rope_theta"] = self.rope_theta
        cfg.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": self.rope_theta})
        cfg["torch_dtype"] = dtype
        cfg["architectures"] = ["DFlashDraftModel"]
        cfg["model_type"] = "qwen3"
        return cfg
