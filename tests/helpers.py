"""Small helpers shared by tests."""

from __future__ import annotations

import os
from pathlib import Path

from kimidflash.background import free_port  # noqa: F401  (one free-port helper, shared with the package)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PRODUCTION_CONFIGS = sorted(p.name for p in CONFIGS.glob("production*.env"))
ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.env"))
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"


def write_env(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def random_llama(path: Path, **config) -> Path:
    """A seeded random Llama saved at `path` (a small HF target for capture tests); `config` sets LlamaConfig."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(path)
    return path
