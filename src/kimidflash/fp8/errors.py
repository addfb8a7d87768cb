"""The FP8 KV tools' errors, in one leaf module.

Those meaning "this input cannot be used" derive from RecipeError, so the
command table reports them in one line with exit 2. CheckFailed is the
validator's exit 1: the check ran and could not pass.
"""

from __future__ import annotations

from ..errors import RecipeError


class SafetensorsError(RecipeError, ValueError):
    """A safetensors file that cannot be read as one (the message names the file)."""


class CheckpointError(RecipeError, ValueError):
    """A checkpoint or overlay that cannot be used; the message names file, layer and tensor."""


class ScaleFileError(RecipeError, ValueError):
    """A scales file that is missing, unreadable or inconsistent (message names it)."""


class CalibrationError(RecipeError, ValueError):
    """Bad input or a failed calibration; the message names the culprit."""


class InputError(RecipeError, ValueError):
    """Bad input to the validator (exit 2): the message names the culprit."""


class CaptureError(RuntimeError):
    """The model could not be instrumented, or produced a non-finite KV value."""


class ServerRequestError(RuntimeError):
    """A request the server did not answer usefully; the message names the prompt."""


class CheckFailed(RuntimeError):
    """The check could not pass (exit 1), e.g. a server that would not start."""
