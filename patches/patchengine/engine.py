"""Each patch's state on a tree, the staged edits (apply and revert) and their checks."""

from __future__ import annotations

import py_compile
import tempfile
from pathlib import Path

from .common import EXIT_IO, MANIFEST, MARKER_RE, Failure, parse_version, sha256
from .spec import marker, marks_of, read_source, stamped_edits, stamped_marker, variant_hash
from .tree import Tree


def in_range(version: tuple, ranges) -> bool:
    return any(parse_version(lo) <= version < parse_version(hi) for lo, hi in ranges)


def _short(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    return line if len(line) <= 80 else line[:77] + "..."


def _marked_files(tree: Tree, p) -> dict:
    """{file: [hash or None, ...]} for each variant file carrying the patch's markers."""
    out = {}
    for rel in dict.fromkeys(v["file"] for v in p["variants"]):
        found = marks_of(tree.read(rel), p["id"])
        if found:
            out[rel] = found
    return out


def _judge_marked(p, variant, marks: dict, tree: Tree, fix: str = "reinstall vLLM or revert it by hand") -> str | None:
    """None when the variant is applied exactly (see patch_dflash_rocm.py's docstring), else why
    not, as a drift message."""
    pid = p["id"]
    if variant is None:
        rel = sorted(marks)[0]
        return (
            f"drift: {pid} {rel}: carries the marker {marker(pid)} but no variant of the patch is for this vLLM version"
        )
    rel = variant["file"]
    for other in sorted(marks):
        if other != rel:
            return (
                f"drift: {pid} {other}: carries the marker {marker(pid)}, but the variant "
                f"for this version patches {rel}"
            )
    want = variant_hash(pid, variant)
    found = marks[rel]
    bad = next((h for h in found if h != want), "ok")
    if bad is None:
        return (
            f"drift: {pid} {rel}: bare marker {marker(pid)} without a patch hash (patched by "
            "hand or by an older patcher); start from an unmodified vLLM"
        )
    if bad != "ok":
        return (
            f"drift: {pid} {rel}: applied by another patch set (marker {marker(pid)}@{bad}, "
            f"this patch set's is @{want}); revert with the patch set that applied it, or "
            "start from an unmodified vLLM"
        )
    text = tree.read(rel) or ""
    edits = stamped_edits(pid, variant)
    counts = [text.count(s) for _, s in edits]
    expected = sum(len(marks_of(s, pid)) for _, s in edits)
    if all(n == 1 for n in counts) and len(found) == expected:
        return None
    verbatim = sum(1 for n in counts if n == 1)
    return (
        f"drift: {pid} {rel}: the patched text was changed after it was applied "
        f"({verbatim} of {len(edits)} patched regions verbatim; markers found: {len(found)}, "
        f"the patch has {expected}); {fix}"
    )


def retired_marks(retired, tree: Tree) -> list:
    """A drift result for each retired patch whose marker is still in one of the files
    it used to patch: the tree was patched by an older patch set."""
    results = []
    for r in retired:
        for rel in r["files"]:
            if marks_of(tree.read(rel), r["id"]):
                results.append(
                    {
                        "id": r["id"],
                        "group": "retired",
                        "what": r["what"],
                        "state": "drift",
                        "file": rel,
                        "marker": None,
                        "detail": (
                            f"drift: {r['id']} {rel}: carries the marker {marker(r['id'])} of a "
                            "patch this patch set retired (an older patch set patched this "
                            "tree); revert with that patch set, or start from an unmodified "
                            "vLLM"
                        ),
                    }
                )
                break
    return results


def plan(patches, base: Path, tree: Tree, version: tuple, manifest: dict) -> list:
    """Decide each patch's state and stage the edits of those to apply."""
    results = []
    for p in patches:
        pid = p["id"]
        variant = next((v for v in p["variants"] if in_range(version, v["versions"])), None)
        res = {
            "id": pid,
            "group": p["group"],
            "what": p["what"],
            "state": None,
            "file": (variant or p["variants"][0])["file"],
            "detail": "",
            "marker": stamped_marker(pid, variant) if variant else None,
        }
        results.append(res)
        marks = _marked_files(tree, p)
        if marks:
            why = _judge_marked(p, variant, marks, tree)
            if why:
                res.update(state="drift", detail=why, file=sorted(marks)[0])
                continue
            res["state"] = "already-applied"
        elif p["upstream"] and all(m["contains"] in (tree.read(m["file"]) or "") for m in p["upstream"]):
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
            want = read_source(base, pid, a["source"])
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
    """The modified-file rules (patch_dflash_rocm.py's docstring) on every file a patch about to be
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
            return (
                f"exists, but {MANIFEST} has no record of installing it (modified outside "
                "the patcher); start from an unmodified vLLM"
            )
        m = MARKER_RE.search(text)
        if m:
            return (
                f"modified before the patcher's first run: it carries the marker "
                f"{m.group(0)!r} but {MANIFEST} has no record of it; start from an "
                "unmodified vLLM"
            )
        return None
    if sha256(text) not in (entry.get("original_sha256"), entry.get("patched_sha256")):
        return (
            f"changed since the patcher wrote it (neither the original nor the patched "
            f"bytes recorded in {MANIFEST}); reinstall vLLM"
        )
    return None


def plan_revert(patches, tree: Tree, manifest: dict) -> list:
    """Stage the reverse replacements of every patch whose exact markers are present,
    and the removal of the files the patch set installed."""
    results = []
    for p in reversed(patches):
        pid = p["id"]
        res = {
            "id": pid,
            "group": p["group"],
            "what": p["what"],
            "state": "not-applied",
            "file": p["variants"][0]["file"],
            "detail": "",
            "marker": None,
        }
        results.insert(0, res)
        marks = _marked_files(tree, p)
        if marks:
            res["file"] = sorted(marks)[0]
            candidates = [v for v in p["variants"] if v["file"] in marks]
            done = next((v for v in candidates if _judge_marked(p, v, marks, tree) is None), None)
            if done is None:
                # the most telling message: a variant whose hash the markers carry
                found = {h for hs in marks.values() for h in hs}
                v = next(
                    (v for v in candidates if variant_hash(pid, v) in found), candidates[0] if candidates else None
                )
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
                res.update(
                    state="drift",
                    file=a["path"],
                    detail=(f"drift: {pid} {a['path']}: {MANIFEST} has no record of installing it; left alone"),
                )
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
            errors.append(f"drift: {rel}: {MANIFEST} has no record of its original bytes; cannot revert it")
    for rel in sorted(manifest):
        tree.read(rel)
        if sha256(tree.staged[rel]) != manifest[rel].get("original_sha256"):
            errors.append(f"drift: {rel}: reverting does not give the original bytes")
    return errors


def compile_staged(tree: Tree, rels) -> list:
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
        raise Failure(
            EXIT_IO,
            f"I/O error: cannot stage files in the temporary directory ({exc.strerror or exc}); nothing was changed",
        ) from None
    return errors
