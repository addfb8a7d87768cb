"""The pre-sharding tool's errors, in one leaf module."""

from __future__ import annotations

from ..errors import RecipeError


class PreshardError(RecipeError, ValueError):
    """A source, an output folder or a pre-sharded checkpoint the tool cannot use; the message names it."""
