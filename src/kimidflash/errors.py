"""The exit statuses every command shares, and the one base class of bad input.

A leaf module: each package keeps its own error types in its own ``errors``
module, and those that mean "the user gave us something unusable" derive from
:class:`RecipeError`, so the command table turns every one of them into a single
line on stderr and exit status 2 without knowing the package it came from.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and its check failed (config-docs --check, validate-fp8)
EXIT_USAGE = 2  # bad input or an unusable environment, named in one line
EXIT_INTERRUPTED = 130  # Ctrl-C; whatever partial result the command keeps is written first


class RecipeError(Exception):
    """Bad input or an unusable environment: one line that names the culprit (exit 2)."""
