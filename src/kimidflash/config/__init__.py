"""Env-file configs: schema, loading, combination rules."""

from .errors import ConfigError
from .loader import load_config, parse_overrides
from .model import Config, hidden_states_layers
from .rules import check_checkpoints, check_config
from .schema import BY_NAME, FIELDS, Field

__all__ = ["BY_NAME", "FIELDS", "Config", "ConfigError", "Field", "check_checkpoints", "check_config",
           "hidden_states_layers", "load_config", "parse_overrides"]
