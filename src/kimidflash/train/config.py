"""The training config (JSON): one file says everything a run depends on.

Relative paths resolve from the config file's folder, like the env files.
Unknown keys are refused with the key named, so a typo cannot silently fall
back to a default. The drafter's shape lives in its own JSON (the same form
as configs/kimi-k2.6-dflash-draft.json) so serving and training share it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from ..paths import cache_dir

DEFAULTS: dict[str, Any] = {
    "name": "drafter",
    "comment": "",
    "seed": 0,
    "run_dir": None,  # default: <cache>/train-runs/<name>
    "target": {"serve_config": None, "serve_overrides": ["SPECULATIVE_METHOD=none"], "model_dir": None},
    "drafter_config": None,
    "data": {"prompts": "synthetic:1000", "heldout_fraction": 0.05, "min_free_disk_gb": 5},
    "regen": {"base_url": None, "model": None, "concurrency": 8, "max_tokens": 256, "temperature": 0.0,
              "chunk": 0, "records": None},
    "capture": {"source": "hf", "mode": "cache", "dtype": "bfloat16", "shard_records": 64},
    "train": {"steps": 1000, "batch_size": 4, "anchors_per_seq": 32, "block_size": 8, "gamma": 4.0, "lr": 6e-4,
              "weight_decay": 0.0, "warmup_steps": 50, "min_lr_ratio": 0.1, "grad_clip": 1.0,
              "autocast": "bfloat16", "checkpoint_every": 100, "log_every": 10, "threads": 0,
              "records": None, "init_std": 0.02},
    "eval": {"k": [3, 7], "max_records": 64, "split": "heldout"},
    "export": {"out": None, "dtype": "bfloat16", "block_size": None},
}
PATH_KEYS = (("target", "serve_config"), ("target", "model_dir"), ("drafter_config",), ("run_dir",),
             ("export", "out"))


class TrainConfigError(ValueError):
    """One line naming the file and the key."""


def _merge(base: dict, over: dict, where: str) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k not in base:
            raise TrainConfigError(f"{where}: unknown key '{k}'")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise TrainConfigError(f"{where}: '{k}' must be an object")
            out[k] = _merge(base[k], v, f"{where}.{k}")
        else:
            out[k] = v
    return out


def _resolve(value: str | None, folder: Path) -> str | None:
    if value is None:
        return None
    p = Path(os.path.expandvars(os.path.expanduser(value)))
    return str(p if p.is_absolute() else (folder / p).resolve())


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise TrainConfigError(f"training config not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TrainConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    cfg = _merge(DEFAULTS, raw, str(path))
    for dotted, value in (overrides or {}).items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            if p not in node or not isinstance(node[p], dict):
                raise TrainConfigError(f"--set {dotted}: unknown key '{p}'")
            node = node[p]
        if leaf not in node:
            raise TrainConfigError(f"--set {dotted}: unknown key '{leaf}'")
        node[leaf] = value
    folder = path.resolve().parent
    for keys in PATH_KEYS:
        node = cfg
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = _resolve(node[keys[-1]], folder)
    if not cfg["drafter_config"]:
        raise TrainConfigError(f"{path}: 'drafter_config' is required")
    if cfg["run_dir"] is None:
        cfg["run_dir"] = str(cache_dir() / "train-runs" / cfg["name"])
    cfg["_path"] = str(path.resolve())
    return cfg


def drafter_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    p = Path(cfg["drafter_config"])
    if not p.is_file():
        raise TrainConfigError(f"drafter_config not found: {p}")
    shape = json.loads(p.read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "block_size", "dflash_config"):
        if key not in shape:
            raise TrainConfigError(f"{p}: missing '{key}'")
    ids = shape["dflash_config"].get("target_layer_ids")
    if not ids:
        raise TrainConfigError(f"{p}: dflash_config.target_layer_ids is empty")
    n = shape.get("num_target_layers")
    if n is not None and max(ids) >= n - 1:
        raise TrainConfigError(f"{p}: target_layer_ids {ids} include the target's last layer ({n - 1}); "
                               "its HF hidden state is after the final norm, vLLM's is not")
    return shape


def parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise TrainConfigError(f"--set {item}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out
