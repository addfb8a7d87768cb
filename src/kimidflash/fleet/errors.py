"""The fleet package's error type, in one leaf module."""

from __future__ import annotations

from ..errors import RecipeError


class FleetError(RecipeError, ValueError):
    """A fleet file that cannot be used: one line naming the file and the field."""
