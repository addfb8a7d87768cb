"""Env-file configs: schema, loading, combination rules."""

from .loader import Config, ConfigError, load_config, parse_overrides
from .schema import BY_NAME, FIELDS, Field

__all__ = ["BY_NAME", "FIELDS", "Config", "ConfigError", "Field", "load_config", "parse_overrides"]
