#!/usr/bin/env python3
"""Version-aware build-time patcher for vLLM: the ROCm DFlash/MLA patches and the
FP8 KV running-max scale fix (kimidflash).

Why a tool and not sed: each patch must know which vLLM releases it is for, notice
when vLLM already has the capability, refuse to build when the code it expects has
moved (drift), and never leave a half-patched tree. The patches themselves are data
(patchset.py beside this file); this engine is Python standard library only because
it runs inside any vLLM image at build time.

States per patch: applied (now), already-applied (our marker present), upstream
(vLLM has it natively), not-applicable (no variant for this version), drift (anchor
missing or ambiguous); --check and --dry-run report pending instead of applied.
Exit codes: 0 ok, 2 usage, 3 drift, 4 --check found pending patches, 5 a patched
file does not compile. The tree is changed only when every patch and every staged
file is fine.
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

EXIT_OK, EXIT_USAGE, EXIT_DRIFT, EXIT_PENDING, EXIT_COMPILE = 0, 2, 3, 4, 5
HERE = Path(__file__).resolve().parent
DEFAULT_PATCHSET = HERE / "patchset.py"
MANIFEST = "_kimidflash_patches.json"  # inside the vllm package: originals' hashes
PATCH_KEYS = ("id", "group", "what", "why", "upstream", "variants")
STATES = ("applied", "already-applied", "upstream", "not-applicable", "drift", "pending")


class UsageError(Exception):
    """Bad input: reported as one line, exit 2."""


# ---------------------------------------------------------------- patch set data
def load_patchset(path: Path | None = None) -> tuple[list, Path]:
    """Read and validate a patch set (.json, or a .py whose PATCHES = [...] is a
    literal; it is parsed, never executed). Returns (patches, directory of the file)."""
    path = Path(path or DEFAULT_PATCHSET)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"patch set {path}: cannot read ({exc.strerror})") from None
    try:
        if path.suffix == ".json":
            patches = json.loads(text)
        else:
            patches = None
            for node in ast.parse(text, str(path)).body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "PATCHES" for t in node.targets
                ):
                    patches = ast.literal_eval(node.value)
            if patches is None:
                raise UsageError(f"patch set {path}: no PATCHES = [...] assignment")
    except (ValueError, SyntaxError) as exc:
        raise UsageError(f"patch set {path}: not valid data ({exc})") from None
    _validate(patches, path)
    return patches, path.parent


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
                if not e.get("anchor") or "replace" not in e:
                    raise UsageError(f"{where}: every edit needs 'anchor' and 'replace'")
                if marker(name) not in e["replace"]:
                    raise UsageError(f"{where}: a replacement lacks the marker {marker(name)!r}")
        for a in p.get("adds") or []:
            if not (a.get("path") and a.get("source")):
                raise UsageError(f"{where}: adds need 'path' and 'source'")


def marker(patch_id: str) -> str:
    """The comment every replacement of a patch carries."""
    return f"kimidflash:{patch_id}"


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
    except OSError:
        raise UsageError(f"patch {pid}: file to install {base / source} is missing") from None


# ---------------------------------------------------------------- vLLM tree
def parse_version(text: str, what: str = "version") -> tuple:
    """Release numbers of a version string ('0.20.2rc1+rocm' -> (0, 20, 2))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        raise UsageError(f"{what}: cannot parse version {text!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    return nums + (0,) * (3 - len(nums))


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
    except (OSError, SyntaxError) as exc:
        raise UsageError(f"{path}: cannot read the vLLM version ({exc})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                return str(node.value.value)
    raise UsageError(f"{path}: no __version__; pass --vllm-version")


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
            self.staged[rel] = self.original[rel]
        return self.staged[rel]

    def changed(self) -> list:
        return sorted(r for r in self.staged if self.staged[r] != self.original[r])


def plan(patches, base: Path, tree: Tree, version: tuple) -> list:
    """Decide each patch's state and stage the edits of those to apply."""
    results = []
    for p in patches:
        pid = p["id"]
        variant = next((v for v in p["variants"] if _in_range(version, v["versions"])), None)
        res = {"id": pid, "group": p["group"], "what": p["what"], "state": None,
               "file": (variant or p["variants"][0])["file"], "detail": ""}
        results.append(res)
        text = tree.read(variant["file"]) if variant else None
        applied = variant is not None and text is not None and all(
            e["replace"] in text for e in variant["edits"])
        if applied:
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
        elif text is None:
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
    return results


def _stage_edits(pid: str, variant, tree: Tree, res) -> str:
    rel = variant["file"]
    text = tree.read(rel)
    for e in variant["edits"]:
        if e["replace"] in text:
            continue  # this edit of a partly applied patch is in place already
        n = text.count(e["anchor"])
        if n != 1:
            why = "anchor not found" if n == 0 else f"anchor found {n} times"
            res["detail"] = f"drift: {pid} {rel}: {why}: {_short(e['anchor'])!r}"
            return "drift"
        text = text.replace(e["anchor"], e["replace"], 1)
    tree.staged[rel] = text
    return "applied"


def plan_revert(patches, tree: Tree) -> list:
    """Stage the reverse replacements of every patch whose marker is present."""
    results = []
    for p in reversed(patches):
        pid = p["id"]
        res = {"id": pid, "group": p["group"], "what": p["what"], "state": "not-applied",
               "file": p["variants"][0]["file"], "detail": ""}
        results.insert(0, res)
        for v in p["variants"]:
            text = tree.read(v["file"])
            if text is None or marker(pid) not in text:
                continue
            res["file"] = v["file"]
            if not all(text.count(e["replace"]) == 1 for e in v["edits"]):
                continue
            for e in reversed(v["edits"]):
                text = text.replace(e["replace"], e["anchor"], 1)
            tree.staged[v["file"]] = text
            res["state"] = "reverted"
            break
        else:
            if any(marker(pid) in (tree.read(v["file"]) or "") for v in p["variants"]):
                res.update(state="drift", detail=f"drift: {pid} {res['file']}: marker present "
                           "but the patched text was changed; cannot revert")
        for a in p.get("adds") or []:
            if tree.read(a["path"]) is not None:
                tree.staged[a["path"]] = None
                if res["state"] == "not-applied":
                    res["state"] = "reverted"
    return results


def _compile_staged(tree: Tree, rels) -> list:
    """py_compile every changed file in a temporary copy; returns error lines."""
    errors = []
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
    return errors


def _write_all(tree: Tree, rels) -> None:
    """Write staged files (each via a temp file + rename); undo all on failure."""
    done = []
    try:
        for rel in rels:
            path = tree.pkg / rel
            new = tree.staged[rel]
            if new is None:
                path.unlink()
            else:
                fd, tmp = tempfile.mkstemp(prefix=".kimidflash-", dir=str(path.parent))
                with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                    f.write(new)
                if path.exists():
                    shutil.copymode(str(path), tmp)
                else:
                    os.chmod(tmp, 0o644)
                os.replace(tmp, path)
            done.append(rel)
    except BaseException:
        for rel in done:
            old = tree.original[rel]
            if old is None:
                (tree.pkg / rel).unlink()
            else:
                with open(tree.pkg / rel, "w", encoding="utf-8", newline="") as f:
                    f.write(old)
        raise


def _manifest_update(tree: Tree, rels, hash_: str, version: str, revert: bool) -> list:
    """Keep the first-seen original hash of every file we touched (so --revert can
    prove byte-identity later); the manifest goes away on revert."""
    old = json.loads(tree.read(MANIFEST) or "{}")
    if revert:
        tree.staged[MANIFEST] = None
        return [r for r in old.get("files", {})]
    files = dict(old.get("files", {}))
    for rel in rels:
        entry = files.setdefault(rel, {"original_sha256": sha256(tree.original[rel])})
        entry["patched_sha256"] = sha256(tree.staged[rel])
    data = {"patchset_sha256": hash_, "vllm_version": version, "files": files}
    tree.staged[MANIFEST] = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return []


def run(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except UsageError as exc:
        print(f"patch_dflash_rocm: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args) -> int:
    patch_path = Path(args.patch_set) if args.patch_set else None
    patches, base = load_patchset(patch_path)
    full_hash = patchset_hash(patch_path)
    if args.print_hash:
        print(full_hash[:12])
        return EXIT_OK
    pkg = locate_vllm(args.vllm_root)
    version_str = args.vllm_version or read_version(pkg)
    version = parse_version(version_str, "vLLM")
    tree = Tree(pkg)
    mode = "revert" if args.revert else "check" if args.check else \
        "dry-run" if args.dry_run else "apply"

    if mode == "revert":
        results = plan_revert(patches, tree)
    else:
        results = plan(patches, base, tree, version)
    changed = tree.changed()
    errors = [r["detail"] for r in results if r["state"] == "drift"]
    code = EXIT_DRIFT if errors else EXIT_OK

    if mode == "revert" and not errors:
        known = {r: v["original_sha256"] for r, v in
                 json.loads(tree.read(MANIFEST) or "{}").get("files", {}).items()}
        for rel in changed:
            if rel in known and sha256(tree.staged[rel]) != known[rel]:
                errors.append(f"drift: {rel}: reverting does not give the original bytes")
                code = EXIT_DRIFT
        if changed:
            _manifest_update(tree, changed, full_hash, version_str, revert=True)
    if not errors and changed:
        errors += _compile_staged(tree, changed)
        if errors:
            code = EXIT_COMPILE
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
            _manifest_update(tree, changed, full_hash, version_str, revert=False)
        _write_all(tree, tree.changed())

    wrote = mode in ("apply", "revert") and not errors
    files = {rel: {"before": sha256(tree.original[rel]),
                   "after": sha256(tree.staged[rel] if wrote else tree.original[rel])}
             for rel in sorted(tree.original) if rel != MANIFEST}
    for r in results:
        print(f"{r['id']:<4} {r['state']:<15} {r['file']}"
              + (f"  ({r['detail']})" if r["detail"] and r["state"] != "drift" else ""))
    for line in errors:
        print(f"patch_dflash_rocm: {line}", file=sys.stderr)
    if errors:
        print("patch_dflash_rocm: nothing was changed", file=sys.stderr)
    if args.json:
        report = {"tool": "patch_dflash_rocm", "mode": mode, "exit_code": code,
                  "vllm_root": str(pkg), "vllm_version": version_str,
                  "patchset_sha256": full_hash, "patchset_hash": full_hash[:12],
                  "patches": results, "files": files, "errors": errors}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return code


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="patch_dflash_rocm.py",
        description="Apply the kimidflash vLLM patch set (ROCm DFlash/MLA + FP8 KV scale).")
    ap.add_argument("--vllm-root", metavar="DIR",
                    help="the vllm package (or its parent); default: the installed vllm")
    ap.add_argument("--vllm-version", metavar="V",
                    help="treat the tree as this release (e.g. for a nightly build)")
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
