"""The docker package's error types, in one leaf module.

`EngineUnavailable` and `ContainerError` mean the environment cannot serve as
asked (no daemon, no image for the pin): one line naming the fix, exit 2, so
they derive from `RecipeError`. `BuildFailed` and `CpuBaseError` are a build
that ran and failed (exit 1). Each keeps RuntimeError as a base so existing
`except RuntimeError` callers still catch it.
"""

from __future__ import annotations

from ..errors import RecipeError


class EngineUnavailable(RecipeError, RuntimeError):
    """No daemon answered; the message is the one line a user sees."""


class ContainerError(RecipeError, RuntimeError):
    """One line naming the container or image problem and the fix."""


class BuildFailed(RuntimeError):
    """The build stopped; the message is the builder's (or patcher's) own last error lines."""


class CpuBaseError(RuntimeError):
    """The CPU base image could not be made; the message says which step and why."""
