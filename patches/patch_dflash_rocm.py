#!/usr/bin/env python3
"""Version-aware build-time patcher for vLLM: the ROCm DFlash/MLA patches and the
FP8 KV running-max scale fix (kimidflash).

Why a tool and not sed: each patch must know which vLLM releases it is for, notice
when vLLM already has the capability, refuse to build when the code it expects has
moved (drift), and never leave a half-patched tree. The patches themselves are data
(patchset.py beside this file); this engine is Python standard library only because
it runs inside any vLLM image at build time. This file is its command line; the parts
are the package patchengine/ beside it (which this file puts on sys.path itself, so
it runs from any directory and loads by path).

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
import difflib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from patchengine.common import (  # noqa: E402 (patchengine is importable only after the sys.path insert above)
    EXIT_COMPILE,
    EXIT_DRIFT,
    EXIT_INTERNAL,
    EXIT_IO,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_USAGE,
    MANIFEST,
    Failure,
    UsageError,
    parse_version,
    sha256,
)
from patchengine.engine import (  # noqa: E402 (patchengine is importable only after the sys.path insert above)
    compile_staged,
    in_range,
    plan,
    plan_revert,
    retired_marks,
    revert_errors,
)
from patchengine.spec import (  # noqa: E402 (patchengine is importable only after the sys.path insert above)
    DEFAULT_PATCHSET,
    load_patchset,
    load_patchset_and_retired,
    patchset_hash,
    release_ranges,
    stamped_edits,
    stamped_marker,
    variant_hash,
)
from patchengine.tree import Tree, locate_vllm, not_a_release, read_manifest, read_version  # noqa: E402
from patchengine.writer import Writer, manifest_data  # noqa: E402

# What tools and tests that load this file by path use, besides run().
__all__ = [
    "run",
    "load_patchset",
    "load_patchset_and_retired",
    "patchset_hash",
    "variant_hash",
    "stamped_marker",
    "stamped_edits",
    "parse_version",
    "not_a_release",
    "in_range",
    "MANIFEST",
    "DEFAULT_PATCHSET",
    "EXIT_OK",
    "EXIT_INTERNAL",
    "EXIT_USAGE",
    "EXIT_DRIFT",
    "EXIT_PENDING",
    "EXIT_COMPILE",
    "EXIT_IO",
]


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
        return args.vllm_version, parse_version(args.vllm_version, "--vllm-version"), "--vllm-version", installed
    if installed is None:
        return None, None, "vllm/_version.py", None
    why = not_a_release(installed)
    if why and mode != "revert":
        raise UsageError(
            f"vLLM version {installed!r} in {pkg / '_version.py'} is {why}, so its release "
            "numbers do not say which release's code it has; pass --assume-version X.Y.Z "
            f"naming that release (this patch set has variants for {release_ranges(patches)})"
        )
    return installed, (parse_version(installed) if not why else None), "vllm/_version.py", installed


def _run(args) -> int:
    patch_path = Path(args.patch_set) if args.patch_set else None
    patches, retired, base = load_patchset_and_retired(patch_path)
    full_hash = patchset_hash(patch_path)
    if args.print_hash:
        print(full_hash[:12])
        return EXIT_OK
    mode = "revert" if args.revert else "check" if args.check else "dry-run" if args.dry_run else "apply"
    pkg = locate_vllm(args.vllm_root)
    version_str, version, source, installed = _decide_version(args, pkg, patches, mode)
    report_tmp = _reserve_report(args.json)
    try:
        return _execute(
            args, mode, patches, retired, base, pkg, full_hash, (version_str, version, source, installed), report_tmp
        )
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
        raise Failure(EXIT_IO, f"I/O error: cannot write the report {dest}: it is a directory; nothing was changed")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".patch-report-", dir=str(path.parent))
        os.close(fd)
    except OSError as exc:
        raise Failure(
            EXIT_IO, f"I/O error: cannot write the report {dest}: {exc.strerror or exc}; nothing was changed"
        ) from None
    return tmp


def _execute(args, mode, patches, retired, base, pkg, full_hash, version_info, report_tmp) -> int:
    version_str, version, source, installed = version_info
    tree = Tree(pkg)
    manifest = read_manifest(tree)
    results = plan_revert(patches, tree, manifest) if mode == "revert" else plan(patches, base, tree, version, manifest)
    results += retired_marks(retired, tree)
    errors = [r["detail"] for r in results if r["state"] == "drift"]
    if mode == "revert" and not errors:
        errors += revert_errors(tree, manifest)
        if not errors and tree.read(MANIFEST) is not None:
            tree.staged[MANIFEST] = None
    code = EXIT_DRIFT if errors else EXIT_OK
    changed = tree.changed()
    if not errors and changed:
        errors += compile_staged(tree, changed)
        if errors:
            code = EXIT_COMPILE
    writer = Writer(tree)
    if mode in ("check", "dry-run"):
        for r in results:
            if r["state"] == "applied":
                r["state"] = "pending"
        if mode == "dry-run" and not errors:
            for rel in changed:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        (tree.original[rel] or "").splitlines(True),
                        (tree.staged[rel] or "").splitlines(True),
                        f"a/vllm/{rel}",
                        f"b/vllm/{rel}",
                    )
                )
        if mode == "check" and code == EXIT_OK and changed:
            code = EXIT_PENDING
    elif not errors and changed:
        if mode == "apply":
            tree.staged[MANIFEST] = manifest_data(tree, manifest, changed, full_hash, version_str)
            # the manifest first: a run killed midway leaves originals on record
            writer.write([MANIFEST] + [r for r in changed if r != MANIFEST])
        else:
            writer.write([r for r in changed if r != MANIFEST] + [r for r in changed if r == MANIFEST])

    wrote = mode in ("apply", "revert") and not errors
    files = {
        rel: {"before": sha256(tree.original[rel]), "after": sha256(tree.staged[rel] if wrote else tree.original[rel])}
        for rel in sorted(tree.original)
        if rel != MANIFEST
    }
    if args.json:
        report = {
            "tool": "patch_dflash_rocm",
            "mode": mode,
            "exit_code": code,
            "vllm_root": str(pkg),
            "vllm_version": version_str,
            "vllm_version_installed": installed,
            "version_source": source,
            "patchset_sha256": full_hash,
            "patchset_hash": full_hash[:12],
            "patches": results,
            "files": files,
            "errors": errors,
        }
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
        print(
            f"{r['id']:<4} {r['state']:<15} {r['file']}"
            + (f"  ({r['detail']})" if r["detail"] and r["state"] != "drift" else "")
        )
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
        prog="patch_dflash_rocm.py", description="Apply the kimidflash vLLM patch set (ROCm DFlash/MLA + FP8 KV scale)."
    )
    ap.add_argument("--vllm-root", metavar="DIR", help="the vllm package (or its parent); default: the installed vllm")
    version = ap.add_mutually_exclusive_group()
    version.add_argument(
        "--assume-version",
        metavar="X.Y.Z",
        help="match patches as for this release (for a development build whose code is that release's)",
    )
    version.add_argument(
        "--vllm-version", metavar="V", help="older spelling: treat the tree as version V, taken as given"
    )
    ap.add_argument("--patch-set", metavar="FILE", help="patch set (.py or .json)")
    ap.add_argument("--json", metavar="FILE", help="write a machine-readable report")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="change nothing; exit 4 if patches that apply are missing")
    mode.add_argument("--dry-run", action="store_true", help="change nothing; print unified diffs")
    mode.add_argument("--revert", action="store_true", help="restore the original files byte for byte")
    mode.add_argument("--print-hash", action="store_true", help="print the short patch-set hash (image tag) and exit")
    return ap


if __name__ == "__main__":
    sys.exit(run())
