"""The one error the real prompt sets raise: a line naming the file or spec and what was wrong.

Bad input (a spec, an archive that is not the expected one), so a RecipeError:
the command table makes it one line and exit status 2."""

from __future__ import annotations

from ..errors import RecipeError


class RealPromptsError(RecipeError, ValueError):
    pass
