"""Read env files into a typed, validated `Config`.

Files are parsed with python-dotenv (so quoting, comments and `${VAR}`
interpolation behave as users know them). A file may `INCLUDE` another,
which is loaded first. Every value remembers where it came from, which is
what `serve.sh --print-config` shows.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from ..errors import ConfigError
from ..settings import BY_NAME, FIELDS, Field
from .model import Config
from .rules import check_checkpoints, check_config

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}
# Values a user may set from the process environment rather than a file.
FROM_ENVIRON = ("API_KEY",)


def coerce(f: Field, raw: str, source: str) -> Any:
    raw = raw.strip()
    if f.kind == "bool":
        low = raw.lower()
        if low in TRUE:
            return True
        if low in FALSE:
            return False
        raise ConfigError(f.name, f"expected true or false, got {raw!r}", source)
    if f.kind in ("int", "float"):
        try:
            value: Any = int(raw) if f.kind == "int" else float(raw)
        except ValueError:
            raise ConfigError(
                f.name, f"expected {'an integer' if f.kind == 'int' else 'a number'}, got {raw!r}", source
            ) from None
        if (f.minimum is not None and value < f.minimum) or (f.maximum is not None and value > f.maximum):
            raise ConfigError(f.name, f"{raw} is out of range; allowed {f.describe_type()}", source)
        return value
    if f.kind == "choice":
        if raw not in f.choices:
            hint = difflib.get_close_matches(raw, f.choices, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f.name, f"{raw!r} is not one of {', '.join(f.choices)}{extra}", source)
        return raw
    if f.kind == "path":
        if not raw:
            return ""
        value = Path(os.path.expanduser(raw))
        # Relative paths in a file are relative to that file, not to the caller's cwd.
        if not value.is_absolute() and source not in ("default", "--set", "process environment"):
            value = Path(source).parent / value
        return str(value)
    return raw


def _read_file(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, str], dict[str, str], list[Path]]:
    """Raw string values and their sources for `path` and what it includes."""
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError("INCLUDE", f"include cycle: {chain}", str(path))
    if not path.is_file():
        raise ConfigError("config", f"env file {path} does not exist")
    parsed = dotenv_values(path, interpolate=True)
    raw: dict[str, str] = {}
    sources: dict[str, str] = {}
    files: list[Path] = []
    include = parsed.get("INCLUDE")
    if include:
        inc = Path(os.path.expanduser(include))
        if not inc.is_absolute():
            inc = path.parent / inc
        raw, sources, files = _read_file(inc, (*seen, path))
    for key, value in parsed.items():
        if key == "INCLUDE":
            continue
        if key not in BY_NAME:
            hint = difflib.get_close_matches(key, BY_NAME, n=1)
            extra = f"; did you mean {hint[0]}?" if hint else "; see docs/configuration.md for the keys"
            raise ConfigError(key, f"unknown key{extra}", str(path))
        if value is None:
            raise ConfigError(key, "has no value (write KEY=VALUE)", str(path))
        raw[key] = value
        sources[key] = str(path)
    return raw, sources, [*files, path]


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, str] | Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    check_files: bool = True,
) -> Config:
    """Load `path` (and its includes), apply `overrides`, validate. `overrides` is a mapping of keys
    to raw values, or the `KEY=VALUE` strings `--set` collected (cliargs.add_set), parsed here.

    ``check_files=False`` leaves out the rules that read the checkpoints, for a
    caller that runs them itself once it has made the models (`serve`)."""
    environ = os.environ if environ is None else environ
    raw: dict[str, str] = {}
    sources: dict[str, str] = {}
    files: list[Path] = []
    if path is not None:
        raw, sources, files = _read_file(Path(path), ())
    for key in FROM_ENVIRON:
        if environ.get(key):
            raw[key], sources[key] = environ[key], "process environment"
    if isinstance(overrides, str):  # a str is a Sequence[str] too: one KEY=VALUE is a list of one
        raise TypeError(f"overrides: a list of KEY=VALUE strings or a mapping, not the string {overrides!r}")
    if overrides is not None and not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        if key not in BY_NAME:
            hint = difflib.get_close_matches(key, BY_NAME, n=1)
            raise ConfigError(key, "unknown key" + (f"; did you mean {hint[0]}?" if hint else ""), "--set")
        raw[key], sources[key] = value, "--set"
    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.name in raw:
            values[f.name.lower()] = coerce(f, raw[f.name], sources[f.name])
        else:
            values[f.name.lower()] = f.default
            sources[f.name] = "default"
    config = Config(**values, sources=sources, path=Path(path).resolve() if path is not None else None, files=files)
    check_config(config)
    if check_files:
        check_checkpoints(config)
    return config


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(item or "--set", "expected KEY=VALUE", "--set")
        out[key.strip()] = value
    return out
