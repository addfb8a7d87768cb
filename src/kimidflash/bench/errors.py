"""The benchmark's error types, in one leaf module so every other module (and
the command line) can name them without importing the code that raises them.

Those that mean "the user gave us something unusable" (an option, a file, a
server that is not there) derive from :class:`kimidflash.errors.RecipeError`:
the command table turns any that escape into one line and exit status 2. The
``ValueError`` bases stay so existing ``except ValueError`` callers keep working.
"""

from __future__ import annotations

from ..errors import RecipeError


class BenchError(RecipeError):
    """Bad input or an unusable server: one line naming the culprit."""


class ResultError(RecipeError, ValueError):
    """A result file we cannot read; the message names the file."""


class ReportError(RecipeError, ValueError):
    """Inputs compare cannot use; the message names the file or label."""


class PromptError(RecipeError, ValueError):
    """A prompt source we cannot use; the message names the file and the line."""


class MetricsError(ValueError):
    """The server's /metrics text is not Prometheus exposition format. Not bad
    user input: the run records it and goes on without server counters."""
