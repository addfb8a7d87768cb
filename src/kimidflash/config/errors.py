"""The config package's one error type, in a leaf module so the loader and the
rules both import it without importing each other."""

from __future__ import annotations

from ..errors import RecipeError


class ConfigError(RecipeError):
    """A config the recipe refuses; the message names the key and the fix."""

    def __init__(self, key: str, message: str, source: str = ""):
        self.key, self.source = key, source
        where = f" ({source})" if source else ""
        super().__init__(f"{key}{where}: {message}")
