"""Which target a training run learns from, read from the serve config.

Every phase needs the target's checkpoint folder (capture, train, eval and
export load its embeddings or run it), regen also its served name, setup its
prepare mode; one function answers all of them from the same serve config the
recipe serves with, so training and serving cannot disagree about the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import load_config, parse_overrides
from .config import TrainConfig
from .errors import TrainConfigError


@dataclass(frozen=True)
class TargetInfo:
    model_dir: str
    served_name: str | None
    prepare: str

    def __getitem__(self, key: str) -> str | None:
        return getattr(self, key)


def target_info(cfg: TrainConfig) -> TargetInfo:
    """Target dir, served name and prepare mode, from the serve config (or target.model_dir)."""
    model_dir, served_name, prepare = cfg.target.model_dir, cfg.regen.model, "none"
    if cfg.target.serve_config:
        env = load_config(cfg.target.serve_config, parse_overrides(cfg.target.serve_overrides))
        model_dir = model_dir or str(env["MODEL_DIR"])
        served_name = served_name or env["SERVED_MODEL_NAME"]
        prepare = env["PREPARE_MODELS"]
    if not model_dir:
        raise TrainConfigError(f"{cfg.path}: set target.serve_config or target.model_dir")
    return TargetInfo(model_dir, served_name, prepare)


def capture_overrides(cfg: TrainConfig, layer_ids: list[int], states_dir: str) -> list[str]:
    """The serve overrides under which the recipe's target writes the hidden states
    the drafter learns from (capture.source=vllm): vLLM's extract_hidden_states."""
    return [*cfg.target.serve_overrides, "SPECULATIVE_METHOD=extract_hidden_states",
            f"HIDDEN_STATES_DIR={states_dir}", "HIDDEN_STATES_LAYERS=" + ",".join(map(str, layer_ids))]
