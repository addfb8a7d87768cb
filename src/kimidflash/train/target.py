"""Which target a training run learns from, read from the serve config.

Every phase needs the target's checkpoint folder (capture, train, eval and
export load its embeddings or run it), regen also its served name, setup its
prepare mode; one function answers all of them from the same serve config the
recipe serves with, so training and serving cannot disagree about the target.

Remote code, the same way: the serve config's TRUST_REMOTE_CODE (vLLM loads the
tokenizer with it), or, for a bare target.model_dir, whether the checkpoint
ships its own classes (an `auto_map`). Kimi's tokenizer is such a class;
loading it without remote code fails, or silently tokenizes otherwise than
the served target does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint_layout import declares_remote_code
from ..config import load_config
from ..errors import TrainConfigError
from .config import TrainConfig


@dataclass(frozen=True)
class TargetInfo:
    model_dir: str
    served_name: str | None
    prepare: str
    trust_remote_code: bool = False
    dtype: str = "auto"  # the served DTYPE: what extract_hidden_states writes (float32 on our CPU configs)
    max_model_len: int | None = None

    def __getitem__(self, key: str) -> str | None:
        return getattr(self, key)


def target_info(cfg: TrainConfig) -> TargetInfo:
    """Target dir, served name and prepare mode, from the serve config (or target.model_dir)."""
    model_dir, served_name, prepare, trust = cfg.target.model_dir, cfg.regen.model, "none", None
    dtype, max_len = "auto", None
    if cfg.target.serve_config:
        env = load_config(cfg.target.serve_config, cfg.target.serve_overrides)
        model_dir = model_dir or str(env.model_dir)
        served_name = served_name or env.served_model_name
        prepare = env.prepare_models
        trust = bool(env.trust_remote_code)
        dtype, max_len = str(env.dtype), env.max_model_len
    if not model_dir:
        raise TrainConfigError(f"{cfg.path}: set target.serve_config or target.model_dir")
    return TargetInfo(
        model_dir, served_name, prepare, declares_remote_code(model_dir) if trust is None else trust, dtype, max_len
    )


def remote_code(cfg: TrainConfig, model_dir: str) -> bool:
    """trust_remote_code for loading `model_dir` (the run's target, or one a caller names) with transformers."""
    if cfg.target.serve_config or cfg.target.model_dir:
        info = target_info(cfg)
        if str(info.model_dir) == str(model_dir):
            return info.trust_remote_code
    return declares_remote_code(model_dir)


def load_tokenizer(info: TargetInfo) -> Any:
    """The target's tokenizer, loaded as the serve config says (see the module docstring)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(info.model_dir, trust_remote_code=info.trust_remote_code)


def capture_overrides(cfg: TrainConfig, layer_ids: list[int], states_dir: str) -> list[str]:
    """The serve overrides under which the recipe's target writes the hidden states
    the drafter learns from (capture.source=vllm): vLLM's extract_hidden_states."""
    return [
        *cfg.target.serve_overrides,
        "SPECULATIVE_METHOD=extract_hidden_states",
        f"HIDDEN_STATES_DIR={states_dir}",
        "HIDDEN_STATES_LAYERS=" + ",".join(map(str, layer_ids)),
    ]
