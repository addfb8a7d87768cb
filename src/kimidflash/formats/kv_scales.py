"""KV-cache scales measured by calibration: one typed shape, one JSON file.

``payload/calibrate_kv_scales.py`` writes it, ``fp8.checkpoint`` turns it into scale
tensors a stock vLLM loads, the running-max patch (P10) can start from it
(``KV_SCALES_FILE``), and docs and reports read it. The measured quantity is the
largest |value| of exactly what the cache stores per layer:

* ``mla``: one entry per token holding the compressed latent (``kv_c_normed``) and
  the rope key (``k_pe`` after rotary) under ONE scale (vLLM's ``_k_scale``;
  ``_v_scale`` is ignored), so ``k_amax = max(latent_amax, rope_amax)``;
* ``mha``: keys after rotary (``k_amax``) and values (``v_amax``), each its own scale.

The file holds amax values (format-free) plus the derived checkpoint scales (OCP
e4m3fn units, see ``formats``); reading checks the two agree, so a hand-edited
scale is caught rather than silently used.

P10 reads this file inside vLLM with the stdlib only: it relies on ``schema``,
``headroom`` and, per entry of ``layers``, ``index`` and ``k_amax``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import ScaleFileError
from ..fsio import read_json, write_json_atomic
from .fp8 import CHECKPOINT_FORMAT, FP8_MAX, scale_for

SCHEMA = "kimidflash-kv-scales/1"
Attention = Literal["mla", "mha"]


# Why a checkpoint-scales overlay cannot reach an MLA target on stock vLLM: serve refuses that
# config (config/rules.py) and the overlay writer refuses the model (fp8/checkpoint.py).
MLA_LIMIT = (
    "stock vLLM (0.20.2-0.33.0) creates no KV scale parameters for MLA layers under a compressed-tensors "
    "config (CompressedTensorsConfig.get_quant_method tests isinstance(layer, Attention); MLAAttention is "
    "not one), and 0.32/0.33 also rename MLA scale tensors to self_attn.attn.attn.*, so these scales would "
    "be ignored and _k_scale stays 1.0"
)


@dataclass(frozen=True)
class LayerScale:
    index: int
    k_amax: float
    v_amax: float | None = None  # mha only
    latent_amax: float | None = None  # mla only: kv_c_normed alone
    rope_amax: float | None = None  # mla only: k_pe after rotary alone


@dataclass(frozen=True)
class KvScales:
    attention: Attention
    layers: tuple[LayerScale, ...]
    headroom: float
    tokens: int
    prompts: int
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.attention not in ("mla", "mha"):
            raise ScaleFileError(f"attention must be 'mla' or 'mha', got {self.attention!r}")
        if not self.layers:
            raise ScaleFileError("no layers")
        idx = [ly.index for ly in self.layers]
        if idx != list(range(len(idx))):
            raise ScaleFileError(f"layer indices must be 0..{len(idx) - 1} in order, got {idx}")
        for ly in self.layers:
            need = ("k_amax", "v_amax") if self.attention == "mha" else ("k_amax", "latent_amax", "rope_amax")
            for name in need:
                v = getattr(ly, name)
                if v is None or not math.isfinite(v) or v <= 0:
                    raise ScaleFileError(f"layer {ly.index}: {name} must be finite and positive, got {v!r}")
            if self.attention == "mla" and ly.k_amax != max(ly.latent_amax, ly.rope_amax):  # type: ignore[type-var]
                raise ScaleFileError(f"layer {ly.index}: k_amax {ly.k_amax} is not max(latent_amax, rope_amax)")
        if not (math.isfinite(self.headroom) and self.headroom >= 1.0):
            raise ScaleFileError(f"headroom must be >= 1.0, got {self.headroom!r}")

    # ------------------------------------------------------------------ scales
    def checkpoint_scales(self) -> list[tuple[float, float | None]]:
        """(k_scale, v_scale) per layer in the JSON's units (OCP e4m3fn); v_scale None for mla."""
        return self.scales_for(CHECKPOINT_FORMAT)

    def scales_for(self, fmt: str) -> list[tuple[float, float | None]]:
        """(k_scale, v_scale) per layer mapping amax * headroom onto ``fmt``'s largest
        value; v_scale None for mla. What a loader that uses a checkpoint scale as it
        is needs on a platform of that format: vLLM's compressed-tensors KV method does
        (no e4m3fnuz doubling on any pin read), so a compressed-tensors overlay for
        MI300X must carry e4m3fnuz scales (see fp8.checkpoint)."""
        return [
            (
                scale_for(ly.k_amax, fmt, self.headroom),
                scale_for(ly.v_amax, fmt, self.headroom) if ly.v_amax is not None else None,
            )
            for ly in self.layers
        ]

    def summary(self) -> dict[str, Any]:
        ks = [k for k, _ in self.checkpoint_scales()]
        out: dict[str, Any] = {
            "layers": len(self.layers),
            "tokens": self.tokens,
            "prompts": self.prompts,
            "k_amax": [min(ly.k_amax for ly in self.layers), max(ly.k_amax for ly in self.layers)],
            "checkpoint_k_scale": [min(ks), max(ks)],
            "k_scale_by_format": {
                fmt: [min(k for k, _ in r), max(k for k, _ in r)]
                for fmt in FP8_MAX
                if fmt != "e5m2"
                for r in [self.scales_for(fmt)]
            },
        }
        if self.attention == "mla":
            out["rope_exceeds_latent_layers"] = [
                ly.index for ly in self.layers if (ly.rope_amax or 0) > (ly.latent_amax or 0)
            ]
        return out

    # --------------------------------------------------------------------- I/O
    def to_json(self) -> dict[str, Any]:
        layers = []
        for ly, (k, v) in zip(self.layers, self.checkpoint_scales(), strict=False):
            d = {key: val for key, val in asdict(ly).items() if val is not None}
            d["k_scale"] = k
            if v is not None:
                d["v_scale"] = v
            layers.append(d)
        return {
            "schema": SCHEMA,
            "attention": self.attention,
            "headroom": self.headroom,
            "checkpoint_format": CHECKPOINT_FORMAT,
            "tokens": self.tokens,
            "prompts": self.prompts,
            "summary": self.summary(),
            "layers": layers,
            "provenance": self.provenance,
        }

    def save(self, path: str | Path) -> Path:
        return write_json_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, data: Any, source: str = "<scales>") -> KvScales:
        try:
            if not isinstance(data, dict) or data.get("schema") != SCHEMA:
                raise ScaleFileError(
                    f"not a {SCHEMA} file (schema={data.get('schema') if isinstance(data, dict) else None!r})"
                )
            layers = tuple(
                LayerScale(
                    index=int(d["index"]),
                    k_amax=float(d["k_amax"]),
                    v_amax=_opt(d.get("v_amax")),
                    latent_amax=_opt(d.get("latent_amax")),
                    rope_amax=_opt(d.get("rope_amax")),
                )
                for d in data["layers"]
            )
            scales = cls(
                attention=data["attention"],
                layers=layers,
                headroom=float(data["headroom"]),
                tokens=int(data["tokens"]),
                prompts=int(data["prompts"]),
                provenance=dict(data.get("provenance") or {}),
            )
            for d, (k, v) in zip(data["layers"], scales.checkpoint_scales(), strict=False):
                for name, want in (("k_scale", k), ("v_scale", v)):
                    if name in d and (want is None or not math.isclose(float(d[name]), want, rel_tol=1e-6)):
                        raise ScaleFileError(
                            f"layer {d['index']}: {name} {d[name]} does not follow from its amax "
                            f"and headroom ({want}); edited by hand?"
                        )
            return scales
        except ScaleFileError as exc:
            raise ScaleFileError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ScaleFileError(f"{source}: malformed scales file: {exc!r}") from None

    @classmethod
    def load(cls, path: str | Path) -> KvScales:
        return cls.from_json(read_json(path, "KV scales file", ScaleFileError), str(path))


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)
