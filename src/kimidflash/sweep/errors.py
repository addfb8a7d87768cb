"""The sweep and advisor's errors, in one leaf module."""

from __future__ import annotations

from ..errors import RecipeError


class AdviceError(RecipeError, ValueError):
    """Input the advisor cannot use (rates, costs, result files); the message names it."""


class SweepError(RecipeError, ValueError):
    """A grid, a base config or a run folder the sweep cannot use; the message names it."""
