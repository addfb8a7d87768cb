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

Rope scaling, the same rule (`Rope`): the legacy `rope_scaling` and the newer
`rope_parameters` may both be given only when they say the same thing.
transformers 5 lets `rope_scaling` win when both are present (so vLLM 0.32
served our old exports' YaRN while training applied plain RoPE). Only the
types the trainer reproduces exactly as vLLM computes them (default, yarn)
are accepted; any other is refused here, before anything is trained.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TrainConfigError
from ..fsio import read_json

DEFAULT_ROPE_THETA = 1000000.0
REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "dflash_config",
)
# Keys of the drafter JSON that describe training, or that vLLM 0.32's DFlash loader
# would misread (`layer_types` as per-layer attention types): never exported.
NOT_EXPORTED = ("training", "layer_types")
LAYER_TENSORS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def read_json_file(path: Path, what: str) -> Any:
    """A training JSON file (the options, a drafter shape), or one line naming it."""
    return read_json(path, what, TrainConfigError)


def _rope_theta(raw: dict[str, Any], source: str) -> float:
    top = raw.get("rope_theta")
    nested = (raw.get("rope_parameters") or {}).get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise TrainConfigError(
            f"{source}: rope_theta {top} and rope_parameters.rope_theta {nested} differ; keep one, or make them equal"
        )
    value = nested if nested is not None else top
    return float(value) if value is not None else DEFAULT_ROPE_THETA


ROPE_TYPES = ("default", "yarn")
# Every key vLLM's YaRN reads (get_rope), and the keys that name the type and theta.
YARN_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
)
_NAMING_KEYS = ("rope_type", "type", "rope_theta")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for interpolating by `factor` (0.1 ln s + 1, as in the paper and vLLM)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class Rope:
    """The drafter's rotary embedding, as vLLM's get_rope builds it from `rope_parameters`.

    `scaling` holds the YaRN keys as written (the export writes them back unchanged);
    the properties give vLLM's defaults for the ones left out."""

    rope_type: str
    theta: float
    scaling: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.scaling).get(key, default)

    @property
    def factor(self) -> float:
        return float(self.get("factor", 1.0))

    @property
    def magnitude(self) -> float:
        """What cos and sin are multiplied by (vLLM's YaRNScalingRotaryEmbedding.mscale)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.get("attention_factor") is not None:
            return float(self.get("attention_factor"))
        if self.get("mscale") and self.get("mscale_all_dim"):
            return yarn_mscale(self.factor, self.get("mscale")) / yarn_mscale(self.factor, self.get("mscale_all_dim"))
        return yarn_mscale(self.factor)

    def parameters(self) -> dict[str, Any]:
        """transformers' / vLLM's `rope_parameters`."""
        return {"rope_type": self.rope_type, **dict(self.scaling), "rope_theta": self.theta}

    @classmethod
    def from_raw(cls, raw: dict[str, Any], source: str) -> Rope:
        """The rope of a drafter JSON; refuses what the trainer cannot reproduce, naming `source`."""
        given = {}
        for key in ("rope_scaling", "rope_parameters"):
            value = raw.get(key)
            if value is not None and not isinstance(value, dict):
                raise TrainConfigError(f"{source}: {key} is not an object")
            if value:
                given[key] = _standard(value, key, source)
        theta = _rope_theta(raw, source)
        if len(given) == 2:
            old, new = given["rope_scaling"], given["rope_parameters"]
            if _without_theta(old) != _without_theta(new):
                raise TrainConfigError(
                    f"{source}: rope_scaling {raw['rope_scaling']} and rope_parameters "
                    f"{raw['rope_parameters']} disagree (transformers would serve rope_scaling); "
                    "keep one, or make them say the same"
                )
            if "rope_theta" in old and float(old["rope_theta"]) != theta:
                raise TrainConfigError(
                    f"{source}: rope_scaling.rope_theta {old['rope_theta']} differs from rope_theta {theta}"
                )
        spec = given.get("rope_parameters") or given.get("rope_scaling") or {"rope_type": "default"}
        field_ = "rope_parameters" if "rope_parameters" in given else "rope_scaling"
        kind = spec["rope_type"]
        if kind not in ROPE_TYPES:
            raise TrainConfigError(
                f"{source}: {field_} rope type {kind!r} is not one the trainer reproduces "
                f"({', '.join(ROPE_TYPES)}); it would learn other positions than vLLM serves"
            )
        allowed = YARN_KEYS if kind == "yarn" else ()
        extra = sorted(k for k in spec if k not in allowed and k not in _NAMING_KEYS)
        if extra:
            raise TrainConfigError(
                f"{source}: {field_}.{extra[0]} is not reproduced by the trainer for rope type {kind}; remove it"
            )
        if raw.get("is_neox_style", True) is not True or raw.get("partial_rotary_factor", 1.0) != 1.0:
            raise TrainConfigError(
                f"{source}: the trainer applies neox-style RoPE to the whole head; is_neox_style "
                "and partial_rotary_factor must be left out (or true and 1.0)"
            )
        for key in ("factor", "original_max_position_embeddings") if kind == "yarn" else ():
            value = spec.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise TrainConfigError(f"{source}: {field_}.{key} must be a positive number for yarn, got {value!r}")
        return cls(kind, theta, tuple((k, spec[k]) for k in YARN_KEYS if k in spec))


def _without_theta(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "rope_theta"}


def _standard(spec: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """`type` (legacy) read as `rope_type`, as transformers and vLLM do; both and different is refused."""
    out = dict(spec)
    legacy = out.pop("type", None)
    if legacy is not None and out.get("rope_type", legacy) != legacy:
        raise TrainConfigError(f"{source}: {key} says type {legacy!r} and rope_type {out['rope_type']!r}")
    out.setdefault("rope_type", legacy or "default")
    return out


def check_layer_ids(ids: list[int] | tuple[int, ...], num_hidden_layers: int, source: str) -> None:
    """Layer ids must lie in 0..n-2: HF's last hidden state is after the final norm, vLLM's is not,
    so a drafter trained on the last layer would be served other features than it learned from."""
    if min(ids) < 0 or max(ids) >= num_hidden_layers - 1:
        raise TrainConfigError(
            f"{source}: target_layer_ids {list(ids)} must lie in 0..{num_hidden_layers - 2} "
            f"(never the last layer, {num_hidden_layers - 1}: its HF hidden state is after "
            "the final norm, vLLM's is not)"
        )


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
    rope: Rope
    rms_norm_eps: float
    attention_bias: bool
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None

    @classmethod
    def load(cls, path: str | Path) -> DrafterShape:
        p = Path(path)
        return cls.from_dict(read_json_file(p, "drafter_config"), str(p))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "drafter shape") -> DrafterShape:
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
        shape = cls(
            raw=copy.deepcopy(raw),
            source=source,
            hidden_size=H,
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=nh,
            num_key_value_heads=raw["num_key_value_heads"],
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            block_size=raw["block_size"],
            head_dim=raw.get("head_dim") or H // nh,
            rope_theta=_rope_theta(raw, source),
            rope=Rope.from_raw(raw, source),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            attention_bias=raw.get("attention_bias", False),
            mask_token_id=dc["mask_token_id"],
            target_layer_ids=tuple(ids),
            num_target_layers=raw.get("num_target_layers"),
        )
        if shape.num_target_layers is not None:
            shape.check_target(shape.num_target_layers)
        return shape

    @classmethod
    def coerce(cls, shape: DrafterShape | dict[str, Any]) -> DrafterShape:
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

    def with_block_size(self, block_size: int) -> DrafterShape:
        """The same drafter served with another number of queries per draft step."""
        return DrafterShape.from_dict({**self.raw, "block_size": block_size}, self.source)

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor vLLM's DFlash loader reads and its shape: unprefixed, no embeddings or LM head
        (the target's are shared)."""
        H, hd, inter = self.hidden_size, self.head_dim, self.intermediate_size
        nh, nkv, n = self.num_attention_heads, self.num_key_value_heads, len(self.target_layer_ids)
        out: dict[str, tuple[int, ...]] = {"fc.weight": (H, n * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
        per = dict(
            zip(
                LAYER_TENSORS,
                (
                    (nh * hd, H),
                    (nkv * hd, H),
                    (nkv * hd, H),
                    (H, nh * hd),
                    (hd,),
                    (hd,),
                    (inter, H),
                    (inter, H),
                    (H, inter),
                    (H,),
                    (H,),
                ),
                strict=False,
            )
        )
        for i in range(self.num_hidden_layers):
            for k, s in per.items():
                out[f"layers.{i}.{k}"] = s
        return out

    def vllm_config(self, dtype: str) -> dict[str, Any]:
        """config.json of the exported drafter: the shape's own keys, `DFlashDraftModel` on
        `model_type: qwen3`, and one rope description in every field a reader may take it from:
        `rope_theta`, `rope_parameters` (transformers 5, which vLLM 0.32 reads) and, for YaRN,
        `rope_scaling` with the same content (what transformers 4 and older vLLM read)."""
        cfg = {k: copy.deepcopy(v) for k, v in self.raw.items() if k not in NOT_EXPORTED}
        cfg["rope_theta"] = self.rope_theta
        cfg["rope_parameters"] = self.rope.parameters()
        cfg.pop("rope_scaling", None)
        if self.rope.rope_type != "default":
            cfg["rope_scaling"] = {k: v for k, v in self.rope.parameters().items() if k != "rope_theta"}
        cfg["torch_dtype"] = dtype
        cfg["architectures"] = ["DFlashDraftModel"]
        cfg["model_type"] = "qwen3"
        return cfg
