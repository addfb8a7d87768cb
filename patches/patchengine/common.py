"""What every part of the engine shares: exit codes, the two errors, markers, versions."""

from __future__ import annotations

import hashlib
import re

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DRIFT, EXIT_PENDING, EXIT_COMPILE, EXIT_IO = range(7)
MANIFEST = "_kimidflash_patches.json"  # inside the vllm package: originals' hashes
# A marker in a file: kimidflash:<id>, stamped with @<12 hex digits> once applied.
MARKER_RE = re.compile(r"kimidflash:([A-Za-z0-9_-]+)(?:@([0-9a-f]{12})(?![0-9A-Za-z]))?")
HASH_LEN = 12


class UsageError(Exception):
    """Bad input: reported as one line, exit 2."""


class Failure(Exception):
    """Any other failure that stops the run: one line, its own exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def parse_version(text: str, what: str = "version") -> tuple:
    """Release numbers of a version string ('0.20.2rc1+rocm' -> (0, 20, 2))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        raise UsageError(f"{what}: cannot parse version {text!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    return nums + (0,) * (3 - len(nums))


def sha256(data: str | None) -> str | None:
    return None if data is None else hashlib.sha256(data.encode("utf-8")).hexdigest()
