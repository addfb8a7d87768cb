"""The patch set as data: read (never executed), validated, hashed; markers and stamps."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

from .common import HASH_LEN, MARKER_RE, UsageError, parse_version

DEFAULT_PATCHSET = Path(__file__).resolve().parents[1] / "patchset.py"
PATCH_KEYS = ("id", "group", "what", "why", "upstream", "variants")
ID_RE = re.compile(r"[A-Za-z0-9_-]+")


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
        if not (
            isinstance(when, dict)
            and all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(x, str) for x in v)
                for k, v in when.items()
            )
        ):
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
            raise UsageError(
                f"{where}: a replacement carries a stamped marker '{marker(mid)}@{h}'; the patcher adds the hash itself"
            )


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
    return re.sub(
        re.escape(marker(patch_id)) + r"(?![A-Za-z0-9_@-])",
        stamped_marker(patch_id, variant).replace("\\", r"\\"),
        text,
    )


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
            h.update(read_source(base, p["id"], a["source"]).encode())
    return h.hexdigest()[:12] if short else h.hexdigest()


def read_source(base: Path, pid: str, source: str) -> str:
    try:
        return (base / source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise UsageError(f"patch {pid}: file to install {base / source} is missing or unreadable") from None


def release_ranges(patches) -> str:
    """The releases the patch set has variants for, overlapping ranges merged."""
    spans = sorted(
        (parse_version(lo), parse_version(hi), lo, hi)
        for p in patches
        for v in p["variants"]
        for lo, hi in v["versions"]
    )
    merged = []
    for lo_v, hi_v, lo, hi in spans:
        if merged and lo_v <= merged[-1][1]:  # overlaps or touches the previous one
            if hi_v > merged[-1][1]:
                merged[-1][1], merged[-1][3] = hi_v, hi
        else:
            merged.append([lo_v, hi_v, lo, hi])
    return " or ".join(f">={lo},<{hi}" for _, _, lo, hi in merged)
