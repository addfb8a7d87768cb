"""Env-file configs: schema, loading, combination rules."""

from ..errors import ConfigError
from ..settings import BY_NAME, FIELDS, Field
from .loader import load_config, parse_overrides
from .model import SCHEDULE_KEY, Config, Schedule, draft_schedule, format_schedule, hidden_states_layers
from .rules import check_checkpoints, check_config

__all__ = [
    "BY_NAME",
    "FIELDS",
    "Config",
    "ConfigError",
    "Field",
    "Schedule",
    "check_checkpoints",
    "check_config",
    "SCHEDULE_KEY",
    "draft_schedule",
    "format_schedule",
    "hidden_states_layers",
    "load_config",
    "parse_overrides",
]
