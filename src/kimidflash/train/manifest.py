"""The run manifest: what a drafter was made from, written as each phase ends.

inputs (target checkpoint checksums, prompt source, regen sampling), versions
(python, torch, transformers, this package's git commit), the full training
config and drafter shape, seeds, then per-phase results (records, steps,
losses, offline acceptance). The exported drafter carries a copy, committed
under drafters/, so every path in it is recorded through paths.portable()
(repo-relative, `$KIMIDFLASH_CACHE/...`, `~/...`): the config in memory keeps
the absolute paths the phases use.
"""

from __future__ import annotations

import copy
import os
import platform
from pathlib import Path
from typing import Any

from ..errors import TrainConfigError
from ..fsio import git_info, read_json, read_json_object, sha256_file, utc_now, write_json_atomic
from ..paths import REPO_ROOT, portable
from .config import PATH_KEYS, TrainConfig
from .data import SELFSYNTH, read_records


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": str(os.cpu_count()),
        "git_commit": git_info(REPO_ROOT)["revision"],
    }
    for mod in ("torch", "transformers", "safetensors"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


def portable_prompts(spec: str) -> str:
    """A `data.prompts` spec as results record it: each part that is a path (a prompt file, or the
    folder of a `selfsynth:` part, both resolved from the config) made portable."""
    return "+".join(
        SELFSYNTH + portable(part[len(SELFSYNTH) :]) if part.startswith(SELFSYNTH) else portable(part)
        for part in (p.strip() for p in spec.split("+"))
    )


def portable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The training config as the manifest records it: no `_` keys, path keys portable."""
    out = copy.deepcopy({k: v for k, v in cfg.items() if not k.startswith("_")})
    for keys in PATH_KEYS:
        node: dict[str, Any] | None = out
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(keys[-1]), str):
            node[keys[-1]] = portable(node[keys[-1]])
    data = out.get("data")
    if isinstance(data, dict) and isinstance(data.get("prompts"), str):
        data["prompts"] = portable_prompts(data["prompts"])
    return out


def portable_train(train: Any) -> dict[str, Any]:
    """The train section (TrainOptions) as results record it: its path keys portable."""
    return portable_config({"train": train.as_dict()})["train"]


class Manifest:
    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data

    @classmethod
    def open(cls, run: Path) -> Manifest:
        p = run / "manifest.json"
        return cls(p, read_json_object(p, "run manifest", TrainConfigError) if p.is_file() else {})

    def save(self) -> None:
        self.data["updated"] = utc_now()
        write_json_atomic(self.path, self.data)

    def set_setup(
        self, cfg: TrainConfig, drafter: dict[str, Any], target: Path, mask: dict[str, Any] | None, n_prompts: int
    ) -> None:
        """`cfg`: the training config (recorded in its JSON form); `drafter`: the drafter config's JSON;
        `mask`: a DFlash drafter's mask token ({id, token}), None for an EAGLE-3 head."""
        stamp = target / ".kimidflash-smollm2.json"
        self.data.setdefault("created", utc_now())
        self.data["config"] = portable_config(cfg.as_dict())
        self.data["config_file"] = portable(cfg.path)
        self.data["drafter_shape"] = drafter
        self.data["seed"] = cfg.seed
        self.data["target"] = {
            "dir": portable(target),
            "config_sha256": sha256_file(target / "config.json"),
            "origin": read_json(stamp, error=TrainConfigError) if stamp.is_file() else None,
        }
        if mask is not None:
            self.data["mask_token"] = mask
        self.data["prompts"] = {"source": portable_prompts(cfg.data.prompts), "count": n_prompts}
        self.data["versions"] = versions()
        self.save()

    def note_regen(self, out: Path, regen_cfg: dict[str, Any]) -> None:
        recs = read_records(out)
        self.data["regen"] = {
            "records": len(recs),
            "tokens": sum(len(r.input_ids) for r in recs),
            "response_tokens": sum(r.n_response for r in recs),
            "sampling": regen_cfg,
            "finished": utc_now(),
        }
        self.save()

    def note(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def note_eval(self, res: dict) -> None:
        self.note("eval", res)
