"""Writing a staged tree back: one file at a time, and every file put back on failure."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from .common import EXIT_IO, Failure, sha256
from .tree import Tree


class Writer:
    """Writes staged files one by one (temporary file + os.replace) and can put back
    every file it wrote."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.done: list = []

    def write(self, rels) -> None:
        for rel in rels:
            try:
                self._put(rel, self.tree.staged[rel])
            except OSError as exc:
                self.fail(f"cannot write vllm/{rel}: {exc.strerror or exc}")
            except BaseException:
                self.rollback()
                raise
            self.done.append(rel)

    def _put(self, rel: str, new: str | None) -> None:
        path = self.tree.pkg / rel
        if new is None:
            path.unlink()
            return
        fd, tmp = tempfile.mkstemp(prefix=".kimidflash-", dir=str(path.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(new)
            if path.exists():
                shutil.copymode(str(path), tmp)
            else:
                os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def rollback(self) -> list:
        """Put back every file written so far; returns the ones that could not be."""
        failed = []
        for rel in reversed(self.done):
            try:
                self._put(rel, self.tree.original[rel])
            except OSError as exc:
                failed.append(f"vllm/{rel} ({exc.strerror or exc})")
        self.done = []
        return failed

    def fail(self, what: str) -> None:
        failed = self.rollback()
        if failed:
            raise Failure(
                EXIT_IO,
                f"I/O error: {what}; putting back {', '.join(failed)} failed "
                "too: the tree is partly changed, reinstall vLLM",
            )
        raise Failure(EXIT_IO, f"I/O error: {what}; nothing was changed")


def manifest_data(tree: Tree, manifest: dict, rels, hash_: str, version: str) -> str:
    """The manifest after an apply: the first-seen original hash of every file we
    touched (so --revert can prove byte-identity later) and its patched hash."""
    files = {k: dict(v) for k, v in manifest.items()}
    for rel in rels:
        entry = files.setdefault(rel, {"original_sha256": sha256(tree.original[rel])})
        entry["patched_sha256"] = sha256(tree.staged[rel])
    data = {"patchset_sha256": hash_, "vllm_version": version, "files": files}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
