"""Files and their provenance: the one JSON-file reader, atomic writes (a reader sees the old file or the
whole new one, never half), atomic directory publish, sha256 of a file, the UTC
timestamp and the git revision every result records, and the CPU's /proc/cpuinfo fields.

A leaf module (stdlib only) so every part of the package can use it without an
import cycle. Writes go to a temporary file in the destination's directory, are
fsynced, then renamed over the destination; on any failure the temporary file is
removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def _umask_mode() -> int:
    """The mode a plain open() would give: mkstemp's 0600 would hide results from other users."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, published only when the block ends
    cleanly; for writers that stream (torch.save of a checkpoint) instead of
    holding the whole file in memory first."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _umask_mode())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise OSError unless a file could be written at ``path`` now (its folder
    is made if missing, and takes a probe file, removed at once): for commands
    that would otherwise find an unwritable output only after hours of work."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a directory", str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=p.parent, prefix=f".{p.name}.", suffix=".probe"):
        pass


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    with open_atomic(path) as f:
        f.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def read_json(path: str | os.PathLike[str], what: str = "JSON file", error: type[Exception] = ValueError) -> Any:
    """THE reader of a whole JSON file (a result, a manifest, a training config, a checkpoint's
    config.json through checkpoint_layout): `error` carries one line naming the file, whether it is
    missing, unreadable or not JSON, so each caller keeps its own error class and no caller parses twice."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} not found: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: unreadable: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None


def read_json_object(
    path: str | os.PathLike[str], what: str = "JSON file", error: type[Exception] = ValueError
) -> dict[str, Any]:
    """`read_json` for the files that must hold one object (nearly all): a list or a number is named as such."""
    data = read_json(path, what, error)
    if not isinstance(data, dict):
        raise error(f"{path}: not a JSON object")
    return data


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a directory whole: yields a temporary sibling of ``path`` to fill; on a
    clean exit it takes ``path``'s place (an old ``path`` is removed only after the
    swap), on an error it is removed and ``path`` is untouched."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.rename(out, trash / "old")
            os.rename(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_readable(folder: str | os.PathLike[str]) -> None:
    """A published folder (and its files) readable by all, as a checkpoint folder is expected to be:
    atomic_dir's temporary folder is private."""
    os.chmod(folder, 0o755)
    for p in Path(folder).iterdir():
        os.chmod(p, 0o644)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (checkpoint shards are large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpuinfo_field(cpuinfo: str | os.PathLike[str], name: str) -> str | None:
    """The first processor's `name` field in a /proc/cpuinfo file ("model name", "flags"), or
    None when the file or the field is missing. Results record the model; preflight reads the flags."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def utc_now() -> str:
    """Now, as every result file records it: ``2026-11-24T01:10:00Z``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_info(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Revision of the checkout at ``root`` and whether tracked files differ from it;
    both None outside a checkout or without git (an image, an unpacked tarball)."""

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    if rev is None:
        return {"revision": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": rev, "dirty": bool(status) if status is not None else None}


def read_toml_tables(path: Path, what: str, tables: tuple[str, ...], error: type[Exception]) -> dict[str, Any]:
    """A TOML file that may hold only `tables` (as written, e.g. "[router]"); `error`
    names the file for a missing file, bad TOML or an unknown table."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path}: not TOML ({e})") from None
    unknown = set(data) - {t.strip("[]") for t in tables}
    if unknown:
        raise error(f"{what} {path}: unknown table(s) {', '.join(sorted(unknown))}; use {' and '.join(tables)}")
    return data


@contextlib.contextmanager
def sibling_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `.<name>.lock` beside `path`, held for the block: a second
    process that would make the same venv or model waits instead of racing. The parent folder is made
    if it is not there yet (the thing to make is not)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
