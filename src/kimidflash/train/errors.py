"""The training pipeline's error types, in one leaf module.

Each is "bad input or an unusable environment" (a config key, a drafter
shape, a run folder in the wrong state), so each derives from RecipeError
and becomes one line and exit status 2. They keep their ValueError /
RuntimeError base so callers that caught those still do.
"""

from __future__ import annotations

from ..errors import RecipeError


class TrainConfigError(RecipeError, ValueError):
    """A training config, a drafter shape or a run folder that cannot be used: one line naming the file and key."""


class DataError(RecipeError, ValueError):
    """A prompt set or a regen record that cannot be read: names the file and line."""


class RegenError(RecipeError, RuntimeError):
    """The target server answered no usable completion."""


class CaptureError(RecipeError, RuntimeError):
    """The served target gave no usable hidden states (capture.source=vllm)."""


class SpeculatorsError(RecipeError, RuntimeError):
    """A speculators command (train.engine=speculators) failed: names the command and its log."""
