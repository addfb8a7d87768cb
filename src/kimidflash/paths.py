"""Where the recipe's files and caches live."""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import overload

# The checkout this package runs from (src layout: <root>/src/kimidflash).
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
LAUNCHER = REPO_ROOT / "launchers" / "kimi26-vllm-dflash.sh"


def _user_cache() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


def cache_dir() -> Path:
    """What the project makes itself: venvs, generated and converted models, run folders.

    Shared by clones on one machine; CI points it at an empty folder every run
    (`.ci/run`), so nothing here may be needed that the code does not remake."""
    return Path(os.environ.get("KIMIDFLASH_CACHE") or os.path.join(_user_cache(), "kimidflash"))


def downloads_dir() -> Path:
    """Content-addressed downloads (wheels, the debootstrap tarball), each checked
    by sha256 before use. Kept across CI runs; the code works without it."""
    return Path(os.environ.get("KIMIDFLASH_DOWNLOADS") or os.path.join(_user_cache(), "kimidflash-downloads"))


def _roots() -> list[tuple[str, str]]:
    """(absolute folder, what to write instead) for portable(); "" means repo-relative."""
    roots: list[tuple[str | Path, str]] = [
        (REPO_ROOT, ""),
        (cache_dir(), "$KIMIDFLASH_CACHE"),
        (downloads_dir(), "$KIMIDFLASH_DOWNLOADS"),
        (tempfile.gettempdir(), "$TMPDIR"),
        (os.path.expanduser("~"), "~"),
    ]
    out: list[tuple[str, str]] = []
    for folder, label in roots:
        for f in dict.fromkeys((os.path.normpath(os.path.abspath(folder)), os.path.realpath(folder))):
            if f != os.sep:  # HOME=/ must not swallow every path
                out.append((f, label))
    return out


def portable(path: str | os.PathLike[str]) -> str:
    """`path` as results and manifests record it: never the building machine's layout.

    Committed files must not say where one machine kept its checkout, home or
    cache (they are meaningless elsewhere and leak the user's layout), so an
    absolute path inside the checkout becomes repo-relative (`drafters/x`, with
    `..` folded away), one inside cache_dir() or downloads_dir() becomes
    `$KIMIDFLASH_CACHE/...` / `$KIMIDFLASH_DOWNLOADS/...`, one in the temp folder
    `$TMPDIR/...`, one in the home folder `~/...`; the deepest folder wins.
    Anything else (`/models/Kimi-K2.6`: a location the user configured) and
    relative paths are returned unchanged. Only for recording, never for opening.
    """
    s = os.fspath(path)
    if not os.path.isabs(s):
        return s
    roots = _roots()
    for cand in dict.fromkeys((os.path.normpath(s), os.path.realpath(s))):
        hits = [
            (len(f), label, os.path.relpath(cand, f))
            for f, label in roots
            if cand == f or cand.startswith(f.rstrip(os.sep) + os.sep)
        ]
        if hits:
            _, label, rel = max(hits, key=lambda h: h[0])
            if not label:
                return rel
            return label if rel == "." else f"{label}/{rel}"
    return s


def _portable_arg(arg: str) -> str:
    if os.path.isabs(arg):
        return portable(arg)
    key, eq, value = arg.partition("=")
    if eq and os.path.isabs(value):  # --drafter name=/abs/dir, --set export.out=/abs, --out=/abs
        return f"{key}={portable(value)}"
    return arg


def _quote(arg: str) -> str:
    # shlex.quote would single-quote `$KIMIDFLASH_CACHE/x` and `~/x` and so stop the shell expanding them.
    return arg if re.fullmatch(r"[\w@%+=:,./~$-]+", arg) else shlex.quote(arg)


@overload
def portable_argv(argv: str) -> str: ...
@overload
def portable_argv(argv: list[str] | tuple[str, ...]) -> list[str]: ...
def portable_argv(argv: str | list[str] | tuple[str, ...]) -> str | list[str]:
    """A recorded command line with portable() applied to every argument that is an
    absolute path (argv[0], the script, included) and to the value of `key=/abs/path`
    arguments. A string is taken as shell words (shlex) and returned as one, with
    only the rewritten words re-quoted so that `$KIMIDFLASH_CACHE` and `~` stay live."""
    if isinstance(argv, str):
        try:
            words = shlex.split(argv)
        except ValueError:  # not shell words (an unmatched quote): record it as it is
            return argv
        new = [_portable_arg(w) for w in words]
        return " ".join(shlex.quote(w) if w == n else _quote(n) for w, n in zip(words, new, strict=False))
    return [_portable_arg(a) for a in argv]


def include_path(config: str | os.PathLike[str], env_dir: str | os.PathLike[str]) -> str:
    """What an env file written in `env_dir` puts in INCLUDE= to name `config`: relative when the two
    share a folder (a checkout: the file travels with it), else absolute."""
    target, here = Path(config).resolve(), Path(env_dir).resolve()
    return os.path.relpath(target, here) if os.path.commonpath([target, here]) != "/" else str(target)


def link_targets(directory: str | os.PathLike[str]) -> list[str]:
    """Directories outside ``directory`` that its top-level symlinks point into.

    A KV-scale overlay (`kimidflash calibrate --overlay`) links every file of the
    checkpoint beside it: the docker runtime mounts those directories too, and
    validate-fp8 serves its reference from them.
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    found = {str(p.resolve().parent) for p in root.iterdir() if p.is_symlink()}
    return sorted(d for d in found if not Path(d).is_relative_to(root.resolve()))
