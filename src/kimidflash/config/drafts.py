"""The rules that read the draft checkpoint a config names: its family against the method, a
DFlash drafter's block size, an EAGLE-3 head against its own tensors and the target, and the
patches a draft's path needs on the pin.

Apart from rules.py so that each stays short; rules.py runs these in its checkpoint pass and
bench/ab.py reads a drafter's block size through them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .. import backends
from ..backends import DRAFT_MODEL_METHODS
from ..checkpoint_layout import LayoutError, read_config, tensor_shapes, text_field
from ..eagle3 import EAGLE3_ARCHITECTURES, Eagle3Error, Eagle3Head
from ..errors import ConfigError
from ..fsio import read_json_object
from ..settings import Settings
from .model import Config

Fail = Callable[[str, str], NoReturn]


def draft_configs(config: Config) -> list[tuple[str, Path, dict[str, Any]]]:
    """(key, path, JSON) of each draft config the config names that exists: the checkpoint's
    config.json first, then DRAFT_CONFIG (the stand-in for a checkpoint not on this machine)."""
    out = []
    for key in ("DRAFT_MODEL_DIR", "DRAFT_CONFIG"):
        value = config.value(key)
        if not value:
            continue
        path = Path(value) / "config.json" if key == "DRAFT_MODEL_DIR" else Path(value)
        try:  # a checkpoint's config through its one reader; DRAFT_CONFIG is a bare JSON file
            if key == "DRAFT_MODEL_DIR":
                data = read_config(value, ValueError)
            else:
                data = read_json_object(path, key, ValueError) if path.is_file() else None
        except ValueError as exc:
            raise ConfigError(key, f"unreadable drafter config: {exc}", config.sources[key]) from None
        if data is not None:
            out.append((key, path, data))
    return out


def draft_block_size(config: Config) -> tuple[int | None, str]:
    """The drafter's block size and where it was read (checkpoint first)."""
    for _, path, data in draft_configs(config):
        block = block_size(data)
        if block is not None:
            return block, str(path)
    return None, ""


def block_size(data: dict[str, Any]) -> int | None:
    """THE reading of a DFlash drafter's block size off its config.json (None: it states none)."""
    block = data.get("block_size")
    return None if block is None else int(block)


def uncovered_patch(patch_id: str, v: Settings) -> str | None:
    """The releases patch `patch_id` has variants for, when the config takes its path (its runs_when)
    on a pin it has none for: a config that would pass validation and then fail, or serve wrong,
    without it. None when the pin is covered or the path not taken."""
    patch = next((p for p in backends.load_patch_data()[0] if p["id"] == patch_id), None)
    if patch is None or not backends.on_path(patch, v) or backends.covers(patch, v.vllm_version):
        return None
    return ", ".join(f"{lo} to before {hi}" for var in patch["variants"] for lo, hi in var["versions"])


def architecture(data: dict[str, Any]) -> str:
    """The first architecture a config.json names ("" when none)."""
    archs = data.get("architectures") or []
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""


def draft_method(data: dict[str, Any]) -> str | None:
    """The speculative method a draft checkpoint's config.json is served with: `eagle3` for an
    EAGLE-3 head, `dflash` for a DFlash drafter, None when its architecture says neither. A
    speculators-format checkpoint says it in `speculators_model_type`."""
    kind = data.get("speculators_model_type")
    if kind in DRAFT_MODEL_METHODS:
        return str(kind)
    name = architecture(data)
    if name in EAGLE3_ARCHITECTURES:
        return "eagle3"
    if "DFlash" in name or "dflash_config" in data:
        return "dflash"
    return None


def draft_family_rule(config: Config, fail: Fail) -> None:
    """A draft checkpoint of the family the method serves: vLLM would wrap a DFlash drafter as an
    EAGLE-3 head (or the other way round) and fail deep in the load, or not at all."""
    method = config.speculative_method
    if method not in DRAFT_MODEL_METHODS:
        return
    for _, path, data in draft_configs(config)[:1]:
        found = draft_method(data)
        if found is not None and found != method:
            what = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash drafter"}[found]
            fail(
                "SPECULATIVE_METHOD",
                f"{method}, but {path} is {what} ({architecture(data) or 'dflash_config'}); "
                f"set SPECULATIVE_METHOD={found}",
            )


def eagle3_rules(config: Config, fail: Fail, target_cfg: dict[str, Any] | None, final: bool) -> None:
    """The EAGLE-3 head against its own tensors and the target (eagle3.Eagle3Head): one line
    naming the head's config field (`final`: the pin's backbone captures the last layer's output).
    Then the `kimi_k2` trap: a head vLLM's EAGLE wrapper does not count as MLA is served only where
    patch E1 covers the pin."""
    v = config
    found = draft_configs(config)
    if not found:
        return
    key, path, data = found[0]
    layers = text_field(target_cfg, "num_hidden_layers")
    try:
        head = Eagle3Head.from_config(data)
        if target_cfg is not None:
            head.check_target(target_cfg, f"{v.model_dir}/config.json", final_layer=final)
        if key == "DRAFT_MODEL_DIR":
            head.check_tensors(tensor_shapes(v.value(key)), layers)
    except (Eagle3Error, LayoutError) as exc:
        fail(key, f"{path}: {exc}")
    if not head.wrapper_sees_mla():
        pins = uncovered_patch("E1", v)
        if pins:
            fail(
                "VLLM_VERSION",
                f"{v.vllm_version} with {path}, whose model_type {head.model_type} vLLM's EAGLE "
                f"wrapper does not count as MLA (the head's model config then reports "
                f"standard attention, use_mla false); patch E1 fixes that for vLLM {pins}: pin "
                "one of those",
            )
