"""Where a target checkpoint keeps its language model: THE reader of config fields and tensor names.

Why one module: Kimi K2.6 is served as `KimiK25ForConditionalGeneration`, a
wrapper. Its config.json nests the text model's config under `text_config`
(vocab_size, hidden_size, num_hidden_layers, rope_scaling live there), and
its weights sit under `language_model.` beside a vision tower
(`vision_tower.*`, `mm_projector.*`). Readers that each assumed their own
names went wrong silently: the trainer looked for exactly `lm_head.weight`
and, not finding K2.6's `language_model.lm_head.weight`, trained against the
embedding as the head. Every reader of the target (serve's config rules, the
FP8 overlay, the trainer, the warm start, setup) now asks this module.

Names are found by suffix, then checked: the embedding is the one tensor
named `<P>embed_tokens.weight` outside any decoder layer (DeepSeek's MTP
layers carry their own `model.layers.61.embed_tokens.weight`), and its
prefix P is the text model's: `model.` (Llama, Qwen3, DeepseekV3),
`language_model.model.` (K2.5/K2.6), `model.language_model.` (transformers 5
multimodal naming). Decoder layers are `<P>layers.N.`, the final norm
`<P>norm.weight`, and the head is `<W>lm_head.weight` for a W that P starts
with (`lm_head.weight`, `language_model.lm_head.weight`).

A leaf: the standard library only (safetensors headers are read with
safetensors_io), so serve's preflight can use it without torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LayoutError, SafetensorsError
from .fsio import read_json, read_json_object
from .safetensors_io import read_header

INDEX = "model.safetensors.index.json"
EMBED = "embed_tokens.weight"
HEAD = "lm_head.weight"
NORM = "norm.weight"
# The prefixes seen in practice, named in errors so a user sees what was searched for.
KNOWN_PREFIXES = ("model.", "language_model.model.", "model.language_model.")
# Text models whose config class gives kv_lora_rank a default: MLA even when config.json omits it.
MLA_MODEL_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k25")
_IN_LAYER = re.compile(r"(^|\.)layers\.\d+\.")


# ------------------------------------------------------------------ config.json
def text_config(cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The language model's config: multimodal wrappers (Kimi K2.5/K2.6) nest it under `text_config`."""
    cfg = cfg or {}
    nested = cfg.get("text_config")
    return nested if isinstance(nested, dict) else cfg


def text_field(cfg: dict[str, Any] | None, key: str, default: Any = None) -> Any:
    """A field of the language model (vocab_size, hidden_size, num_hidden_layers, rope_scaling ...):
    the text config's, else the top level's (a wrapper may state it once for both)."""
    cfg = cfg or {}
    inner = text_config(cfg)
    if key in inner:
        return inner[key]
    return cfg.get(key, default)


def model_field(cfg: dict[str, Any] | None, key: str, default: Any = None) -> Any:
    """A field vLLM reads off the wrapper first (quantization_config): the top level's, else the text config's."""
    cfg = cfg or {}
    if key in cfg:
        return cfg[key]
    return text_config(cfg).get(key, default)


def is_mla(cfg: dict[str, Any] | None) -> bool:
    """Multi-head latent attention (DeepSeek V2/V3, Kimi): a kv_lora_rank, stated or the model type's default."""
    inner = text_config(cfg)
    if "kv_lora_rank" in inner:
        return bool(inner["kv_lora_rank"])
    return inner.get("model_type") in MLA_MODEL_TYPES


def tie_word_embeddings(cfg: dict[str, Any] | None) -> bool | None:
    """Whether the head is the embedding, as the config states it (None: it does not say).

    The wrapper's statement wins: a multimodal config may say `false` at the top while its
    text_config keeps a class default of `true` (vLLM propagates the top level down)."""
    value = model_field(cfg, "tie_word_embeddings")
    return None if value is None else bool(value)


def read_config(model_dir: str | Path, error: type[Exception] = LayoutError) -> dict[str, Any] | None:
    """THE reader of a checkpoint's config.json (a target's, a drafter's, a speculators checkpoint's):
    None when the folder has none; `error` (the caller's class) names the file when it is not a JSON object."""
    path = Path(model_dir) / "config.json"
    return read_json_object(path, "config.json", error) if path.is_file() else None


def require_config(
    model_dir: str | Path, what: str = "checkpoint", error: type[Exception] = LayoutError
) -> dict[str, Any]:
    """`read_config` for a caller that cannot go on without it: `error` says "<what> not found: <file>"."""
    cfg = read_config(model_dir, error)
    if cfg is None:
        raise error(f"{what} not found: {Path(model_dir) / 'config.json'}")
    return cfg


def declares_remote_code(model_dir: str | Path) -> bool:
    """Whether the checkpoint ships its own classes (an `auto_map` in tokenizer_config.json or
    config.json): transformers then loads its tokenizer only with trust_remote_code (Kimi's is tiktoken)."""
    for name in ("tokenizer_config.json", "config.json"):
        try:
            data = read_json(Path(model_dir) / name)
        except ValueError:  # missing or not JSON: it declares nothing
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            return True
    return False


# ---------------------------------------------------------------- tensor names
def weight_map(model_dir: str | Path) -> dict[str, str]:
    """Tensor name -> shard file name: from model.safetensors.index.json when there is one
    (a sharded checkpoint), else from every *.safetensors file's header."""
    d = Path(model_dir)
    index = d / INDEX
    if index.exists():
        wm = read_json_object(index, INDEX, LayoutError).get("weight_map")
        if not isinstance(wm, dict):
            raise LayoutError(f"{index}: not a safetensors index (no weight_map object)")
        return dict(wm)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise LayoutError(f"{d}: no *.safetensors files and no {INDEX}")
    out: dict[str, str] = {}
    for f in files:
        try:
            out.update((name, f.name) for name in read_header(f) if name != "__metadata__")
        except SafetensorsError as exc:
            raise LayoutError(str(exc)) from None
    return out


def tensor_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape over every *.safetensors file in the folder, from the headers alone;
    empty when the folder holds none (a config-only stand-in)."""
    out: dict[str, list[int]] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            header = read_header(f)
        except SafetensorsError as exc:
            raise LayoutError(str(exc)) from None
        out.update((name, list(meta["shape"])) for name, meta in header.items() if name != "__metadata__")
    return out


@dataclass(frozen=True)
class TextLayout:
    """The text model's tensor names in one checkpoint.

    `head` is the tensor the LM head is read from: the embedding's own name when the
    target ties them (stated, or no head tensor and nothing said)."""

    prefix: str
    embed: str
    head: str
    norm: str | None

    @property
    def tied(self) -> bool:
        return self.head == self.embed

    def layer(self, index: int) -> str:
        """The name prefix of decoder layer `index` (`<P>layers.N.`)."""
        return f"{self.prefix}layers.{index}."


def _outside_layers(names: Iterable[str], suffix: str) -> list[str]:
    """Names ending in `suffix` at a name boundary and not inside a decoder layer."""
    return sorted(
        n
        for n in names
        if n.endswith(suffix)
        and (n == suffix or n[-len(suffix) - 1] == ".")
        and not _IN_LAYER.search(n[: -len(suffix)])
    )


def find_layout(names: Iterable[str], config: dict[str, Any] | None, source: str) -> TextLayout:
    """The embedding, LM head and final norm among `names`; `config` (config.json, or None) says
    whether a missing head means tied embeddings. Refused in one line naming what was searched for."""
    names = set(names)
    embeds = _outside_layers(names, EMBED)
    searched = ", ".join(p + EMBED for p in KNOWN_PREFIXES)
    if not embeds:
        raise LayoutError(
            f"{source}: no token embedding among {len(names)} tensors (searched for a name ending "
            f"in {EMBED} outside decoder layers, e.g. {searched})"
        )
    if len(embeds) > 1:
        raise LayoutError(
            f"{source}: more than one token embedding ({', '.join(embeds)}); cannot tell which is the text model's"
        )
    embed = embeds[0]
    prefix = embed[: -len(EMBED)]
    heads = [h for h in _outside_layers(names, HEAD) if prefix.startswith(h[: -len(HEAD)])]
    # the innermost wrapper's head when several would fit
    head = max(heads, key=len) if heads else None
    tie = tie_word_embeddings(config)
    if head is None and tie is False:
        parts = prefix.split(".")[:-1]  # "language_model.model." -> the wrappers "", "language_model.", ...
        wanted = [".".join(parts[:i] + [HEAD]) for i in range(len(parts) + 1)]
        raise LayoutError(
            f"{source}: config.json says tie_word_embeddings false but no LM head was found "
            f"(searched for {', '.join(wanted)}); the checkpoint is incomplete"
        )
    norm = prefix + NORM if prefix + NORM in names else None
    return TextLayout(prefix, embed, embed if tie or head is None else head, norm)


def decoder_prefix(names: Iterable[str], source: str) -> str:
    """What comes before `layers.N.` in the text model's names: the token embedding's prefix when
    the names hold one; else (a file of layer tensors only) the one prefix before
    `layers.0.self_attn.`. Refused in one line when neither tells."""
    names = list(names)
    embeds = _outside_layers(names, EMBED)
    if len(embeds) == 1:
        prefix = embeds[0][: -len(EMBED)]
        if any(n.startswith(f"{prefix}layers.0.self_attn.") for n in names):
            return prefix
    pat = re.compile(r"^(.*?)layers\.0\.self_attn\.")
    prefixes = sorted({m.group(1) for n in names if (m := pat.match(n))})
    if len(prefixes) != 1:
        raise LayoutError(
            f"{source}: cannot tell the decoder layers' name prefix (embeddings {embeds or 'none'}; "
            f"found {prefixes or 'no layers.0.self_attn.* tensor'})"
        )
    return prefixes[0]


def locate(model_dir: str | Path) -> tuple[TextLayout, dict[str, str]]:
    """The target's text layout and its weight map (name -> shard file), read from headers only."""
    wm = weight_map(model_dir)
    return find_layout(wm, read_config(model_dir), str(model_dir)), wm
