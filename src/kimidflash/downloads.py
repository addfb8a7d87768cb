"""Content-addressed downloads: the only files kept from one CI run to the next.

Everything else the project makes (venvs, converted models, extracted trees,
images) is remade from nothing in every CI run (`.ci/run` points
KIMIDFLASH_CACHE at an empty folder). A download may be kept because it is
pinned by sha256: a file that does not match is deleted and fetched again,
so a truncated or swapped file is never used, and the code behaves the same
when the folder is empty.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import DownloadError
from .fsio import sha256_file, sibling_lock
from .paths import downloads_dir

__all__ = ["DownloadError", "pypi_file", "pypi_wheel", "verified"]


def verified(path: Path, sha256: str) -> bool:
    """True if `path` exists with this digest; a file with another digest is removed."""
    if not path.is_file():
        return False
    if sha256_file(path) == sha256:
        return True
    path.unlink()
    return False


def pypi_wheel(requirement: str, filename: str, sha256: str) -> Path:
    """The wheel `filename` of `requirement` (`name==version`), fetched with pip if
    missing and checked against its published sha256."""
    return pypi_file(requirement, filename, sha256)


def pypi_file(requirement: str, filename: str, sha256: str, *, no_binary: bool = False) -> Path:
    """One distribution file of `requirement` (`name==version`): its wheel, or with
    `no_binary` its source archive (kept under `sdists/`, never built into a wheel nor installed).

    pip runs in hash-checking mode with the pinned digest, so it refuses another
    file before doing anything with it (for an sdist pip still prepares the
    package's metadata, i.e. runs its setup script, in an isolated build
    environment: only the pinned archive's). The digest is checked again here."""
    folder = downloads_dir() / ("sdists" if no_binary else "wheels")
    path = folder / filename
    if verified(path, sha256):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with sibling_lock(path):  # a second process fetching the same file waits, then finds it
        if verified(path, sha256):
            return path
        return _fetch(requirement, path, sha256, no_binary)


def _fetch(requirement: str, path: Path, sha256: str, no_binary: bool) -> Path:
    folder, filename = path.parent, path.name
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "requirements.txt"
        pins.write_text(f"{requirement} --hash=sha256:{sha256}\n")
        kind = "--no-binary=:all:" if no_binary else "--only-binary=:all:"
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "-q",
                    "--no-deps",
                    "--require-hashes",
                    kind,
                    "-d",
                    str(folder),
                    "-r",
                    str(pins),
                ],
                check=True,
            )
        except subprocess.CalledProcessError as e:
            raise DownloadError(
                f"pip download {requirement} (sha256 {sha256}) failed with exit {e.returncode}; pip says why above"
            ) from None
    if not path.is_file():
        raise DownloadError(f"pip download {requirement} did not produce {filename} in {folder}")
    digest = sha256_file(path)
    if digest != sha256:
        path.unlink()
        raise DownloadError(f"{filename}: sha256 {digest} is not the published {sha256}")
    return path
