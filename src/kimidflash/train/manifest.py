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
import json
import os
import platform
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..downloads import sha256_file
from ..paths import REPO_ROOT, portable


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform(),
                                  "cpu_count": str(os.cpu_count()), "git_commit": git_commit()}
    for mod in ("torch", "transformers", "safetensors"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


def atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def portable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The training config as the manifest records it: no `_` keys, path keys portable."""
    from .config import PATH_KEYS

    out = copy.deepcopy({k: v for k, v in cfg.items() if not k.startswith("_")})
    for keys in (*PATH_KEYS, ("data", "prompts")):
        node = out
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(keys[-1]), str):
            node[keys[-1]] = portable(node[keys[-1]])
    return out


class Manifest:
    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data

    @classmethod
    def open(cls, run: Path) -> "Manifest":
        p = run / "manifest.json"
        return cls(p, json.loads(p.read_text()) if p.is_file() else {})

    def save(self) -> None:
        self.data["updated"] = _now()
        atomic_write_json(self.path, self.data)

    def set_setup(self, cfg: dict, shape: dict, target: Path, mask_token: str, n_prompts: int) -> None:
        stamp = target / ".kimidflash-smollm2.json"
        self.data.setdefault("created", _now())
        self.data["config"] = portable_config(cfg)
        self.data["config_file"] = portable(cfg["_path"])
        self.data["drafter_shape"] = shape
        self.data["seed"] = cfg["seed"]
        self.data["target"] = {"dir": portable(target),
                               "config_sha256": sha256_file(target / "config.json"),
                               "origin": json.loads(stamp.read_text()) if stamp.is_file() else None}
        self.data["mask_token"] = {"id": shape["dflash_config"]["mask_token_id"], "token": mask_token}
        self.data["prompts"] = {"source": portable(cfg["data"]["prompts"]), "count": n_prompts}
        self.data["versions"] = versions()
        self.save()

    def note_regen(self, out: Path, regen_cfg: dict) -> None:
        from .data import read_records

        recs = read_records(out)
        self.data["regen"] = {"records": len(recs), "tokens": sum(len(r.input_ids) for r in recs),
                              "response_tokens": sum(r.n_response for r in recs), "sampling": regen_cfg,
                              "finished": _now()}
        self.save()

    def note(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def note_eval(self, res: dict) -> None:
        self.note("eval", res)
