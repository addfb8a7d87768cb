#!/usr/bin/env python3
"""Version-aware build-time patcher for vLLM: the ROCm DFlash/MLA patches and the
FP8 KV running-max scale fix (kimidflash).

Why a tool and not sed: each patch must know which vLLM releases it is for, notice
when vLLM already has the capability, refuse to build when the code it expects has
moved (drift), and never leave a half-patched tree. The patches themselves are data
(patchset.py beside this file); this engine is Python standard library only because
it runs inside any vLLM image at build time.

States per patch: applied (now), already-applied (its exact markers and patched text
are there), upstream (vLLM has it natively), not-applicable (no variant for this
version), drift (anchor missing or ambiguous, patched text changed, another patch
set's markers, a retired patch's marker, or a file modified outside the patcher);
--check and --dry-run report pending instead of applied; --revert reports reverted
or not-applied.

Retired patches. The patch set's RETIRED list names patches it no longer ships and
the files they patched; a marker of one of them in those files is drift in every
mode: an older patch set patched the tree, and this one can neither leave that code
in place unnoticed nor revert it.

Markers. Every replacement in the patch set carries the bare marker
"kimidflash:<id>" (in a comment); when applying, the engine stamps each one as
"kimidflash:<id>@<h>", where <h> is the first 12 hex digits of the sha256 of the
UTF-8 bytes of id, file, anchor 1, replacement 1, anchor 2, replacement 2, ... of the
variant applied, joined by NUL characters (the replacements before stamping).
A patch counts as applied only when every stamped replacement occurs exactly once
in its file and the file carries no other marker of that patch. Any other marker
(another hash, a bare marker, a duplicated or edited patched region, some edits
present and some not) is drift: the patch is never applied a second time.

Modified files. A file is refused as modified outside the patcher (drift) when it
carries any kimidflash marker while the manifest (vllm/_kimidflash_patches.json,
written on the first apply) has no record of it, when its bytes are neither the
original nor the patched bytes the manifest recorded, or when a file the patch set
installs exists without a manifest record. Edits without a marker in a file the
patcher never saw cannot be told from vLLM's own code: start from a clean image.

Versions. The version comes from vllm/_version.py. A final release (N.N.N,
optionally .postN, optionally a local part made only of platform tags and numbers
such as +rocm700, +cpu, +cu128) is matched by its release numbers. A pre-release,
a development build (e.g. 0.19.2.dev312+g1a2b3c.rocm700) or any other local part is
refused (exit 2): its release numbers do not say which release's code it has. Pass
--assume-version X.Y.Z to name that release (--vllm-version V, the older spelling,
also takes the version as given). --revert does not depend on the version.

Exit codes: 0 ok, 1 internal error (a bug in the patcher), 2 usage error (also: a
development build without --assume-version), 3 drift (see above), 4 --check found
pending patches, 5 a patched file does not compile, 6 I/O error (a file or
directory cannot be read or written, e.g. permissions or a read-only file system).
Every failure is one line per problem on stderr, no traceback, and leaves the tree
byte-identical. The tree is changed only when every patch and every staged file is
fine and the --json report's directory is writable; writes go through a temporary
file and os.replace, the manifest first (last on --revert), and are undone if any
write, or the report, fails (should putting a file back fail too, the one line says
the tree is partly changed).
"""
from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shutil
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DRIFT, EXIT_PENDING, EXIT_COMPILE, EXIT_IO = range(7)
HERE = Path(__file__).resolve().parent
DEFAULT_PATCHSET = HERE / "patchset.py"
MANIFEST = "_kimidflash_patches.json"  # inside the vllm package: originals' hashes
PATCH_KEYS = ("id", "group", "what", "why", "upstream", "variants")
ID_RE = re.compile(r"[A-Za-z0-9_-]+")
# A marker in a file: kimidflash:<id>, stamped with @<12 hex digits> once applied.
MARKER_RE = re.compile(r"kimidflash:([A-Za-z0-9_-]+)(?:@([0-9a-f]{12})(?![0-9A-Za-z]))?")
HASH_LEN = 12
PEP440_RE = re.compile(
    r"""^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)
    (?P<pre>[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?
    (?P<post>-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?
    (?P<dev>[-_.]?dev[-_.]?\d*)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$""", re.I | re.X)
PLATFORM_TAG_RE = re.compile(r"(?:cpu|cu\d+|cuda\d*|rocm\d*|hip\d*|xpu|tpu|hpu|neuron|\d+)", re.I)


class UsageError(Exception):
    """Bad input: reported as one line, exit 2."""


class Failure(Exception):
    """Any other failure that stops the run: one line, its own exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- patch set data
def load_patchset(path: Path | None = None) -> tuple[list, Path]:
    """Read and validate a patch set (.json, or a .py whose PATCHES = [...] is a
    literal; it is parsed, never executed). Returns (patches, directory of the file)."""
    patches, _, base = load_patchset_and_retired(path)
    return patches, base


def load_patchset_and_retired(path: Path | None = None) -> tuple[list, list, Path]:
    """load_patchset, plus the set's RETIRED = [...] list (a .py only; [] if none):
    patches it no longer ships, whose markers in their files are drift."""
    path = Path(path or DEFAULT_PATCHSET)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"patch set {path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        retired = []
        if path.suffix == ".json":
            patches = json.loads(text)
        else:
            found = {}
            for node in ast.parse(text, str(path)).body:
                for name in ("PATCHES", "RETIRED"):
                    if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == name for t in node.targets
                    ):
                        found[name] = ast.literal_eval(node.value)
            if "PATCHES" not in found:
                raise UsageError(f"patch set {path}: no PATCHES = [...] assignment")
            patches, retired = found["PATCHES"], found.get("RETIRED", [])
    except (ValueError, SyntaxError) as exc:
        raise UsageError(f"patch set {path}: not valid data ({exc})") from None
    _validate(patches, path)
    _validate_retired(retired, patches, path)
    return patches, retired, path.parent


def _validate(patches, path: Path) -> None:
    if not isinstance(patches, list) or not patches:
        raise UsageError(f"patch set {path}: PATCHES must be a non-empty list")
    seen = set()
    for i, p in enumerate(patches):
        name = p.get("id", f"#{i}") if isinstance(p, dict) else f"#{i}"
        where = f"patch set {path}: patch {name!r}"
        if not isinstance(p, dict):
            raise UsageError(f"{where}: must be a mapping")
        for key in PATCH_KEYS:
            if key not in p:
                raise UsageError(f"{where}: missing key {key!r}")
        if not (isinstance(name, str) and ID_RE.fullmatch(name)):
            raise UsageError(f"{where}: an id is letters, digits, '_' and '-' only")
        if name in seen:
            raise UsageError(f"{where}: duplicate id")
        seen.add(name)
        for m in p["upstream"] or []:
            if not (isinstance(m, dict) and m.get("file") and m.get("contains")):
                raise UsageError(f"{where}: upstream markers need 'file' and 'contains'")
        if not p["variants"]:
            raise UsageError(f"{where}: no variants")
        for v in p["variants"]:
            for key in ("versions", "file", "edits"):
                if key not in v:
                    raise UsageError(f"{where}: variant missing key {key!r}")
            for rng in v["versions"]:
                if len(rng) != 2:
                    raise UsageError(f"{where}: version range {rng!r} is not [min, max)")
                for bound in rng:
                    parse_version(bound, where)
            if not v["edits"]:
                raise UsageError(f"{where}: variant for {v['file']} has no edits")
            for e in v["edits"]:
                if not e.get("anchor") or not isinstance(e.get("replace"), str):
                    raise UsageError(f"{where}: every edit needs 'anchor' and 'replace'")
                _validate_markers(name, e, where)
        for a in p.get("adds") or []:
            if not (a.get("path") and a.get("source")):
                raise UsageError(f"{where}: adds need 'path' and 'source'")
        when = p.get("runs_when", {})
        if not (isinstance(when, dict) and all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(x, str) for x in v)
                for k, v in when.items())):
            raise UsageError(f"{where}: runs_when maps config keys to lists of patterns")


def _validate_retired(retired, patches, path: Path) -> None:
    """RETIRED entries: id (not a shipped patch's), files, what and why."""
    if not isinstance(retired, list):
        raise UsageError(f"patch set {path}: RETIRED must be a list")
    shipped = {p["id"] for p in patches}
    seen = set()
    for i, r in enumerate(retired):
        name = r.get("id", f"#{i}") if isinstance(r, dict) else f"#{i}"
        where = f"patch set {path}: retired patch {name!r}"
        if not isinstance(r, dict) or not all(r.get(k) for k in ("id", "files", "what", "why")):
            raise UsageError(f"{where}: needs 'id', 'files', 'what' and 'why'")
        if not (isinstance(name, str) and ID_RE.fullmatch(name)):
            raise UsageError(f"{where}: an id is letters, digits, '_' and '-' only")
        if name in shipped or name in seen:
            raise UsageError(f"{where}: the id {'is also a shipped patch' if name in shipped else 'is retired twice'}")
        seen.add(name)
        if not (isinstance(r["files"], list) and all(isinstance(f, str) and f for f in r["files"])):
            raise UsageError(f"{where}: files must be a list of paths")


def _validate_markers(pid: str, edit, where: str) -> None:
    """A replacement carries its own patch's bare marker (the engine stamps it) and no
    other; an anchor carries none (markers must only come from the patcher)."""
    if MARKER_RE.search(edit["anchor"]):
        raise UsageError(f"{where}: an anchor carries a kimidflash marker")
    found = MARKER_RE.findall(edit["replace"])
    if not any(mid == pid for mid, _ in found):
        raise UsageError(f"{where}: a replacement lacks the marker {marker(pid)!r}")
    for mid, h in found:
        if mid != pid:
            raise UsageError(f"{where}: a replacement carries another patch's marker {marker(mid)!r}")
        if h:
            raise UsageError(f"{where}: a replacement carries a stamped marker "
                             f"'{marker(mid)}@{h}'; the patcher adds the hash itself")


def marker(patch_id: str) -> str:
    """The bare marker every replacement of a patch carries in the patch set."""
    return f"kimidflash:{patch_id}"


def variant_hash(patch_id: str, variant) -> str:
    """The 12-hex-digit hash stamped into a patch's markers: sha256 over id, file and
    every (anchor, replacement) of the variant, NUL-separated, UTF-8."""
    parts = [patch_id, variant["file"]]
    for e in variant["edits"]:
        parts += [e["anchor"], e["replace"]]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:HASH_LEN]


def stamped_marker(patch_id: str, variant) -> str:
    return f"{marker(patch_id)}@{variant_hash(patch_id, variant)}"


def stamp(patch_id: str, variant, text: str) -> str:
    """text with every bare marker of the patch stamped with the variant's hash."""
    return re.sub(re.escape(marker(patch_id)) + r"(?![A-Za-z0-9_@-])",
                  stamped_marker(patch_id, variant).replace("\\", r"\\"), text)


def stamped_edits(patch_id: str, variant) -> list:
    """(anchor, stamped replacement) of each edit, in order."""
    return [(e["anchor"], stamp(patch_id, variant, e["replace"])) for e in variant["edits"]]


def marks_of(text: str | None, patch_id: str) -> list:
    """The hash of every marker of the patch in text (None: a bare marker)."""
    return [h or None for mid, h in MARKER_RE.findall(text or "") if mid == patch_id]


def patchset_hash(path: Path | None = None, short: bool = False) -> str:
    """sha256 over the patch-set data and the files it installs; the image tag uses
    the short form, so any change to what gets patched changes the tag."""
    patches, base = load_patchset(path)
    h = hashlib.sha256(json.dumps(patches, sort_keys=True, separators=(",", ":")).encode())
    for p in patches:
        for a in p.get("adds") or []:
            h.update(_read_source(base, p["id"], a["source"]).encode())
    return h.hexdigest()[:12] if short else h.hexdigest()


def _read_source(base: Path, pid: str, source: str) -> str:
    try:
        return (base / source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise UsageError(f"patch {pid}: file to install {base / source} is missing or unreadable") from None


def _ranges(patches) -> str:
    """The releases the patch set has variants for, overlapping ranges merged."""
    spans = sorted((parse_version(lo), parse_version(hi), lo, hi)
                   for p in patches for v in p["variants"] for lo, hi in v["versions"])
    merged = []
    for lo_v, hi_v, lo, hi in spans:
        if merged and lo_v <= merged[-1][1]:  # overlaps or touches the previous one
            if hi_v > merged[-1][1]:
                merged[-1][1], merged[-1][3] = hi_v, hi
        else:
            merged.append([lo_v, hi_v, lo, hi])
    return " or ".join(f">={lo},<{hi}" for _, _, lo, hi in merged)


# ---------------------------------------------------------------- vLLM tree
def parse_version(text: str, what: str = "version") -> tuple:
    """Release numbers of a version string ('0.20.2rc1+rocm' -> (0, 20, 2))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        raise UsageError(f"{what}: cannot parse version {text!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    return nums + (0,) * (3 - len(nums))


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
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                return str(node.value.value)
    raise UsageError(f"{path}: no __version__; pass --assume-version X.Y.Z")


def sha256(data: str | None) -> str | None:
    return None if data is None else hashlib.sha256(data.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- the engine
def _in_range(version: tuple, ranges) -> bool:
    return any(parse_version(lo) <= version < parse_version(hi) for lo, hi in ranges)


def _short(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    return line if len(line) <= 80 else line[:77] + "..."


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
                raise Failure(EXIT_IO, f"I/O error: cannot read vllm/{rel}: not UTF-8 text; "
                                       "nothing was changed") from None
            except OSError as exc:
                raise Failure(EXIT_IO, f"I/O error: cannot read vllm/{rel}: "
                                       f"{exc.strerror or exc}; nothing was changed") from None
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
        raise Failure(EXIT_DRIFT, f"drift: vllm/{MANIFEST}: not a manifest this patcher wrote; "
                                  "start from an unmodified vLLM; nothing was changed") from None
    return files


def _marked_files(tree: Tree, p) -> dict:
    """{file: [hash or None, ...]} for each variant file carrying the patch's markers."""
    out = {}
    for rel in dict.fromkeys(v["file"] for v in p["variants"]):
        found = marks_of(tree.read(rel), p["id"])
        if found:
            out[rel] = found
    return out


def _judge_marked(p, variant, marks: dict, tree: Tree,
                  fix: str = "reinstall vLLM or revert it by hand") -> str | None:
    """None when the variant is applied exactly (see the module docstring), else why
    not, as a drift message."""
    pid = p["id"]
    if variant is None:
        rel = sorted(marks)[0]
        return (f"drift: {pid} {rel}: carries the marker {marker(pid)} but no variant of the "
                "patch is for this vLLM version")
    rel = variant["file"]
    for other in sorted(marks):
        if other != rel:
            return (f"drift: {pid} {other}: carries the marker {marker(pid)}, but the variant "
                    f"for this version patches {rel}")
    want = variant_hash(pid, variant)
    found = marks[rel]
    bad = next((h for h in found if h != want), "ok")
    if bad is None:
        return (f"drift: {pid} {rel}: bare marker {marker(pid)} without a patch hash (patched by "
                "hand or by an older patcher); start from an unmodified vLLM")
    if bad != "ok":
        return (f"drift: {pid} {rel}: applied by another patch set (marker {marker(pid)}@{bad}, "
                f"this patch set's is @{want}); revert with the patch set that applied it, or "
                "start from an unmodified vLLM")
    text = tree.read(rel) or ""
    edits = stamped_edits(pid, variant)
    counts = [text.count(s) for _, s in edits]
    expected = sum(len(marks_of(s, pid)) for _, s in edits)
    if all(n == 1 for n in counts) and len(found) == expected:
        return None
    verbatim = sum(1 for n in counts if n == 1)
    return (f"drift: {pid} {rel}: the patched text was changed after it was applied "
            f"({verbatim} of {len(edits)} patched regions verbatim; markers found: {len(found)}, "
            f"the patch has {expected}); {fix}")


def retired_marks(retired, tree: Tree) -> list:
    """A drift result for each retired patch whose marker is still in one of the files
    it used to patch: the tree was patched by an older patch set."""
    results = []
    for r in retired:
        for rel in r["files"]:
            if marks_of(tree.read(rel), r["id"]):
                results.append({
                    "id": r["id"], "group": "retired", "what": r["what"], "state": "drift",
                    "file": rel, "marker": None,
                    "detail": (f"drift: {r['id']} {rel}: carries the marker {marker(r['id'])} of a "
                               "patch this patch set retired (an older patch set patched this "
                               "tree); revert with that patch set, or start from an unmodified "
                               "vLLM")})
                break
    return results


def plan(patches, base: Path, tree: Tree, version: tuple, manifest: dict) -> list:
    """Decide each patch's state and stage the edits of those to apply."""
    results = []
    for p in patches:
        pid = p["id"]
        variant = next((v for v in p["variants"] if _in_range(version, v["versions"])), None)
        res = {"id": pid, "group": p["group"], "what": p["what"], "state": None,
               "file": (variant or p["variants"][0])["file"], "detail": "",
               "marker": stamped_marker(pid, variant) if variant else None}
        results.append(res)
        marks = _marked_files(tree, p)
        if marks:
            why = _judge_marked(p, variant, marks, tree)
            if why:
                res.update(state="drift", detail=why, file=sorted(marks)[0])
                continue
            res["state"] = "already-applied"
        elif p["upstream"] and all(
            m["contains"] in (tree.read(m["file"]) or "") for m in p["upstream"]
        ):
            res["state"] = "upstream"
            res["file"] = p["upstream"][0]["file"]
            res["detail"] = f"found {p['upstream'][0]['contains']!r}"
            continue
        elif variant is None:
            res["state"] = "not-applicable"
            continue
        elif tree.read(variant["file"]) is None:
            res.update(state="drift", detail=f"drift: {pid} {variant['file']}: file not found")
            continue
        else:
            res["state"] = _stage_edits(pid, variant, tree, res)
            if res["state"] == "drift":
                continue
        for a in p.get("adds") or []:
            want = _read_source(base, pid, a["source"])
            if tree.read(a["path"]) != want:
                tree.staged[a["path"]] = want
                res["state"] = "applied"
                res["detail"] = (res["detail"] + f" installed {a['path']}").strip()
    _check_files(patches, tree, manifest, results)
    return results


def _stage_edits(pid: str, variant, tree: Tree, res) -> str:
    rel = variant["file"]
    text = tree.read(rel)
    for anchor, replace in stamped_edits(pid, variant):
        n = text.count(anchor)
        if n != 1:
            why = "anchor not found" if n == 0 else f"anchor found {n} times"
            res["detail"] = f"drift: {pid} {rel}: {why}: {_short(anchor)!r}"
            return "drift"
        text = text.replace(anchor, replace, 1)
    tree.staged[rel] = text
    return "applied"


def _check_files(patches, tree: Tree, manifest: dict, results) -> None:
    """The modified-file rules (module docstring) on every file a patch about to be
    applied (or found applied) edits or installs, judged on the bytes found; a refused
    file makes the patch drift."""
    by_id = {r["id"]: r for r in results}
    for p in patches:
        res = by_id[p["id"]]
        if res["state"] not in ("applied", "already-applied"):
            continue
        files = [(res["file"], False)] + [(a["path"], True) for a in p.get("adds") or []]
        for rel, installed in files:
            text = tree.original.get(rel)
            why = None if text is None else _file_refused(rel, text, installed, manifest)
            if why:
                res.update(state="drift", file=rel, detail=f"drift: {p['id']} {rel}: {why}")
                break


def _file_refused(rel: str, text: str, installed: bool, manifest: dict) -> str | None:
    entry = manifest.get(rel)
    if entry is None:
        if installed:
            return (f"exists, but {MANIFEST} has no record of installing it (modified outside "
                    "the patcher); start from an unmodified vLLM")
        m = MARKER_RE.search(text)
        if m:
            return (f"modified before the patcher's first run: it carries the marker "
                    f"{m.group(0)!r} but {MANIFEST} has no record of it; start from an "
                    "unmodified vLLM")
        return None
    if sha256(text) not in (entry.get("original_sha256"), entry.get("patched_sha256")):
        return (f"changed since the patcher wrote it (neither the original nor the patched "
                f"bytes recorded in {MANIFEST}); reinstall vLLM")
    return None


def plan_revert(patches, tree: Tree, manifest: dict) -> list:
    """Stage the reverse replacements of every patch whose exact markers are present,
    and the removal of the files the patch set installed."""
    results = []
    for p in reversed(patches):
        pid = p["id"]
        res = {"id": pid, "group": p["group"], "what": p["what"], "state": "not-applied",
               "file": p["variants"][0]["file"], "detail": "", "marker": None}
        results.insert(0, res)
        marks = _marked_files(tree, p)
        if marks:
            res["file"] = sorted(marks)[0]
            candidates = [v for v in p["variants"] if v["file"] in marks]
            done = next((v for v in candidates if _judge_marked(p, v, marks, tree) is None), None)
            if done is None:
                # the most telling message: a variant whose hash the markers carry
                found = {h for hs in marks.values() for h in hs}
                v = next((v for v in candidates if variant_hash(pid, v) in found),
                         candidates[0] if candidates else None)
                res.update(state="drift", detail=_judge_marked(p, v, marks, tree, "cannot revert it"))
                continue
            text = tree.read(done["file"])
            for anchor, replace in reversed(stamped_edits(pid, done)):
                text = text.replace(replace, anchor, 1)
            tree.staged[done["file"]] = text
            res.update(state="reverted", file=done["file"], marker=stamped_marker(pid, done))
        for a in p.get("adds") or []:
            if tree.read(a["path"]) is None:
                continue
            if a["path"] not in manifest:
                res.update(state="drift", file=a["path"], detail=(
                    f"drift: {pid} {a['path']}: {MANIFEST} has no record of installing it; "
                    "left alone"))
                continue
            tree.staged[a["path"]] = None
            if res["state"] == "not-applied":
                res["state"] = "reverted"
    return results


def revert_errors(tree: Tree, manifest: dict) -> list:
    """After plan_revert: every changed file must be one the manifest knows, and every
    file it knows must be back at its recorded original bytes."""
    errors = []
    for rel in tree.changed():
        if rel not in manifest:
            errors.append(f"drift: {rel}: {MANIFEST} has no record of its original bytes; "
                          "cannot revert it")
    for rel in sorted(manifest):
        tree.read(rel)
        if sha256(tree.staged[rel]) != manifest[rel].get("original_sha256"):
            errors.append(f"drift: {rel}: reverting does not give the original bytes")
    return errors


def _compile_staged(tree: Tree, rels) -> list:
    """py_compile every changed file in a temporary copy; returns error lines."""
    errors = []
    try:
        with tempfile.TemporaryDirectory(prefix="kimidflash-stage-") as tmp:
            for rel in rels:
                if tree.staged[rel] is None or not rel.endswith(".py"):
                    continue
                dst = Path(tmp) / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                with open(dst, "w", encoding="utf-8", newline="") as f:
                    f.write(tree.staged[rel])
                try:
                    py_compile.compile(str(dst), cfile=str(dst) + "c", doraise=True)
                except py_compile.PyCompileError as exc:
                    errors.append(f"compile error: {rel}: {exc.msg.strip().splitlines()[-1]}")
    except OSError as exc:
        raise Failure(EXIT_IO, f"I/O error: cannot stage files in the temporary directory "
                               f"({exc.strerror or exc}); nothing was changed") from None
    return errors


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
            try:
                os.unlink(tmp)
            except OSError:
                pass
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
            raise Failure(EXIT_IO, f"I/O error: {what}; putting back {', '.join(failed)} failed "
                                   "too: the tree is partly changed, reinstall vLLM")
        raise Failure(EXIT_IO, f"I/O error: {what}; nothing was changed")


def _manifest_data(tree: Tree, manifest: dict, rels, hash_: str, version: str) -> str:
    """The manifest after an apply: the first-seen original hash of every file we
    touched (so --revert can prove byte-identity later) and its patched hash."""
    files = {k: dict(v) for k, v in manifest.items()}
    for rel in rels:
        entry = files.setdefault(rel, {"original_sha256": sha256(tree.original[rel])})
        entry["patched_sha256"] = sha256(tree.staged[rel])
    data = {"patchset_sha256": hash_, "vllm_version": version, "files": files}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def run(argv=None) -> int:
    try:
        return _run(_parser().parse_args(argv))
    except UsageError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except Failure as exc:
        _say(str(exc))
        return exc.code
    except OSError as exc:
        _say(f"I/O error: {exc}; nothing was changed")
        return EXIT_IO
    except Exception as exc:  # a bug: still one line, and the tree was not written
        _say(f"internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


def _say(line: str) -> None:
    print(f"patch_dflash_rocm: {line}", file=sys.stderr)


def _decide_version(args, pkg: Path, patches, mode: str) -> tuple:
    """(version string used, its release numbers or None, where it came from,
    the string vllm/_version.py holds or None)."""
    try:
        installed = read_version(pkg)
    except UsageError:
        if mode != "revert" and not (args.assume_version or args.vllm_version):
            raise
        installed = None
    if args.assume_version:
        if not re.fullmatch(r"\d+\.\d+\.\d+", args.assume_version):
            raise UsageError(f"--assume-version {args.assume_version!r}: give a release as X.Y.Z")
        return args.assume_version, parse_version(args.assume_version), "--assume-version", installed
    if args.vllm_version:
        return args.vllm_version, parse_version(args.vllm_version, "--vllm-version"), \
            "--vllm-version", installed
    if installed is None:
        return None, None, "vllm/_version.py", None
    why = not_a_release(installed)
    if why and mode != "revert":
        raise UsageError(
            f"vLLM version {installed!r} in {pkg / '_version.py'} is {why}, so its release "
            "numbers do not say which release's code it has; pass --assume-version X.Y.Z "
            f"naming that release (this patch set has variants for {_ranges(patches)})")
    return installed, (parse_version(installed) if not why else None), "vllm/_version.py", installed


def _run(args) -> int:
    patch_path = Path(args.patch_set) if args.patch_set else None
    patches, retired, base = load_patchset_and_retired(patch_path)
    full_hash = patchset_hash(patch_path)
    if args.print_hash:
        print(full_hash[:12])
        return EXIT_OK
    mode = "revert" if args.revert else "check" if args.check else \
        "dry-run" if args.dry_run else "apply"
    pkg = locate_vllm(args.vllm_root)
    version_str, version, source, installed = _decide_version(args, pkg, patches, mode)
    report_tmp = _reserve_report(args.json)
    try:
        return _execute(args, mode, patches, retired, base, pkg, full_hash,
                        (version_str, version, source, installed), report_tmp)
    finally:
        if report_tmp and os.path.exists(report_tmp):
            os.unlink(report_tmp)


def _reserve_report(dest: str | None) -> str | None:
    """Prove the report can be written before the tree is touched: a temporary file
    beside it, renamed over it at the end."""
    if not dest:
        return None
    path = Path(dest)
    if path.is_dir():
        raise Failure(EXIT_IO, f"I/O error: cannot write the report {dest}: it is a directory; "
                               "nothing was changed")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".patch-report-", dir=str(path.parent))
        os.close(fd)
    except OSError as exc:
        raise Failure(EXIT_IO, f"I/O error: cannot write the report {dest}: "
                               f"{exc.strerror or exc}; nothing was changed") from None
    return tmp


def _execute(args, mode, patches, retired, base, pkg, full_hash, version_info, report_tmp) -> int:
    version_str, version, source, installed = version_info
    tree = Tree(pkg)
    manifest = read_manifest(tree)
    if mode == "revert":
        results = plan_revert(patches, tree, manifest)
    else:
        results = plan(patches, base, tree, version, manifest)
    results += retired_marks(retired, tree)
    errors = [r["detail"] for r in results if r["state"] == "drift"]
    if mode == "revert" and not errors:
        errors += revert_errors(tree, manifest)
        if not errors and tree.read(MANIFEST) is not None:
            tree.staged[MANIFEST] = None
    code = EXIT_DRIFT if errors else EXIT_OK
    changed = tree.changed()
    if not errors and changed:
        errors += _compile_staged(tree, changed)
        if errors:
            code = EXIT_COMPILE
    writer = Writer(tree)
    if mode in ("check", "dry-run"):
        for r in results:
            if r["state"] == "applied":
                r["state"] = "pending"
        if mode == "dry-run" and not errors:
            for rel in changed:
                sys.stdout.writelines(difflib.unified_diff(
                    (tree.original[rel] or "").splitlines(True),
                    (tree.staged[rel] or "").splitlines(True),
                    f"a/vllm/{rel}", f"b/vllm/{rel}"))
        if mode == "check" and code == EXIT_OK and changed:
            code = EXIT_PENDING
    elif not errors and changed:
        if mode == "apply":
            tree.staged[MANIFEST] = _manifest_data(tree, manifest, changed, full_hash, version_str)
            # the manifest first: a run killed midway leaves originals on record
            writer.write([MANIFEST] + [r for r in changed if r != MANIFEST])
        else:
            writer.write([r for r in changed if r != MANIFEST] + [r for r in changed if r == MANIFEST])

    wrote = mode in ("apply", "revert") and not errors
    files = {rel: {"before": sha256(tree.original[rel]),
                   "after": sha256(tree.staged[rel] if wrote else tree.original[rel])}
             for rel in sorted(tree.original) if rel != MANIFEST}
    if args.json:
        report = {"tool": "patch_dflash_rocm", "mode": mode, "exit_code": code,
                  "vllm_root": str(pkg), "vllm_version": version_str,
                  "vllm_version_installed": installed, "version_source": source,
                  "patchset_sha256": full_hash, "patchset_hash": full_hash[:12],
                  "patches": results, "files": files, "errors": errors}
        try:
            with open(report_tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(report, indent=2) + "\n")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(report_tmp, 0o666 & ~umask)
            os.replace(report_tmp, args.json)
        except OSError as exc:
            writer.fail(f"cannot write the report {args.json}: {exc.strerror or exc}")
    for r in results:
        print(f"{r['id']:<4} {r['state']:<15} {r['file']}"
              + (f"  ({r['detail']})" if r["detail"] and r["state"] != "drift" else ""))
    for line in errors:
        _say(line)
    if errors:
        _say("nothing was changed")
    return code


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other usage error
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="patch_dflash_rocm.py",
        description="Apply the kimidflash vLLM patch set (ROCm DFlash/MLA + FP8 KV scale).")
    ap.add_argument("--vllm-root", metavar="DIR",
                    help="the vllm package (or its parent); default: the installed vllm")
    version = ap.add_mutually_exclusive_group()
    version.add_argument("--assume-version", metavar="X.Y.Z",
                         help="match patches as for this release (for a development build "
                              "whose code is that release's)")
    version.add_argument("--vllm-version", metavar="V",
                         help="older spelling: treat the tree as version V, taken as given")
    ap.add_argument("--patch-set", metavar="FILE", help="patch set (.py or .json)")
    ap.add_argument("--json", metavar="FILE", help="write a machine-readable report")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="change nothing; exit 4 if patches that apply are missing")
    mode.add_argument("--dry-run", action="store_true",
                      help="change nothing; print unified diffs")
    mode.add_argument("--revert", action="store_true",
                      help="restore the original files byte for byte")
    mode.add_argument("--print-hash", action="store_true",
                      help="print the short patch-set hash (image tag) and exit")
    return ap


if __name__ == "__main__":
    sys.exit(run())
