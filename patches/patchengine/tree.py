"""The vllm package on disk: where it is, which release it is, its files and the manifest."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

from .common import EXIT_DRIFT, EXIT_IO, MANIFEST, Failure, UsageError

PEP440_RE = re.compile(
    r"""^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)
    (?P<pre>[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?
    (?P<post>-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?
    (?P<dev>[-_.]?dev[-_.]?\d*)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$""",
    re.I | re.X,
)
PLATFORM_TAG_RE = re.compile(r"(?:cpu|cu\d+|cuda\d*|rocm\d*|hip\d*|xpu|tpu|hpu|neuron|\d+)", re.I)


def not_a_release(text: str) -> str | None:
    """Why a version string does not name a final release's code (None: it does).
    Releases: N.N.N, optionally .postN, optionally a local part of platform tags and
    numbers (+rocm700, +cpu, +cu128)."""
    m = PEP440_RE.match(str(text))
    if not m:
        return "not a PEP 440 version"
    if m.group("epoch") not in (None, "0"):
        return "a version with an epoch"
    if m.group("pre"):
        return "a pre-release"
    if m.group("dev"):
        return "a development build"
    local = m.group("local")
    if local and not all(PLATFORM_TAG_RE.fullmatch(s) for s in re.split(r"[-_.]", local)):
        return "a local build (its '+' part names more than a platform)"
    return None


def locate_vllm(root: str | None) -> Path:
    """The vllm package directory: --vllm-root (the package or its parent) or the
    installed one, found without importing it."""
    if root:
        p = Path(root)
        for cand in (p, p / "vllm"):
            if (cand / "__init__.py").is_file() and (cand / "_version.py").is_file():
                return cand.resolve()
        raise UsageError(f"--vllm-root {root}: no vllm package (__init__.py, _version.py) there")
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("vllm is not installed here; pass --vllm-root DIR")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def read_version(pkg: Path) -> str:
    """__version__ from vllm/_version.py, read as data."""
    path = pkg / "_version.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the vLLM version ({exc})") from None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        ):
            return str(node.value.value)
    raise UsageError(f"{path}: no __version__; pass --assume-version X.Y.Z")


class Tree:
    """Reads files of the vllm package once and stages edits in memory (newline
    handling is left alone so writing back is byte-exact)."""

    def __init__(self, pkg: Path):
        self.pkg = pkg
        self.original: dict = {}
        self.staged: dict = {}

    def read(self, rel: str) -> str | None:
        if rel not in self.original:
            try:
                with open(self.pkg / rel, encoding="utf-8", newline="") as f:
                    self.original[rel] = f.read()
            except FileNotFoundError:
                self.original[rel] = None
            except UnicodeDecodeError:
                raise Failure(
                    EXIT_IO, f"I/O error: cannot read vllm/{rel}: not UTF-8 text; nothing was changed"
                ) from None
            except OSError as exc:
                raise Failure(
                    EXIT_IO, f"I/O error: cannot read vllm/{rel}: {exc.strerror or exc}; nothing was changed"
                ) from None
            self.staged[rel] = self.original[rel]
        return self.staged[rel]

    def changed(self) -> list:
        return sorted(r for r in self.staged if self.staged[r] != self.original[r])


def read_manifest(tree: Tree) -> dict:
    """{file: {"original_sha256", "patched_sha256"}} from the manifest ({} if none)."""
    raw = tree.read(MANIFEST)
    if raw is None:
        return {}
    try:
        files = json.loads(raw)["files"]
        if not all(isinstance(v, dict) and "original_sha256" in v for v in files.values()):
            raise ValueError
        if any(Path(rel).is_absolute() or ".." in Path(rel).parts for rel in files):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Failure(
            EXIT_DRIFT,
            f"drift: vllm/{MANIFEST}: not a manifest this patcher wrote; "
            "start from an unmodified vLLM; nothing was changed",
        ) from None
    return files
