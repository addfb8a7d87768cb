"""The result file's format: its schema, the checks a document must pass, and
reading and writing it.

Apart from result.py (which builds the document from a run) because everything
that only reads results (compare, series, the advisor, validate) needs this and
nothing of the run. Files are written atomically (fsio), so a reader never sees
half a file, even when the run is interrupted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import BenchError, ResultError
from ..fsio import check_writable, read_json_object, write_text_atomic

SCHEMA_NAME = "kimidflash-bench-result"
SCHEMA_VERSION = 1

_NUM = (int, float)
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "schema_version": (int,),
    "partial": (bool,),
    "label": (str,),
    "provenance": (dict,),
    "config": (dict,),
    "num_prompts": (int,),
    "completed": (int,),
    "failed": (int,),
    "not_started": (int,),
    "errors": (dict,),
    "duration": _NUM,
    "total_input_tokens": (int,),
    "total_output_tokens": (int,),
    "server_metrics": (dict,),
    "warmup": (dict,),
    "requests": (list,),
}
NULLABLE_NUM = (
    "max_concurrency",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p95_e2el_ms",
    "mean_slot_wait_ms",
    "mean_per_user_output_throughput",
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
)
PROVENANCE_KEYS = ("tool_version", "git", "host", "utc_time", "server", "model")
REQUEST_KEYS = ("session", "turn", "due_s", "slot_wait_ms", "ttft_ms", "e2el_ms", "output_tokens", "itl_ms", "error")


def validate_result(doc: Any) -> list[str]:
    """Problems with a result document (empty when valid): its shape first, then
    whether its figures agree with the requests it lists. A run in which no
    request completed is valid (its figures are null); `no_completion` tells it."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    return _shape_problems(doc) or _consistency_problems(doc)


def _shape_problems(doc: dict[str, Any]) -> list[str]:
    """Schema, required keys and their types, provenance and request keys."""
    problems: list[str] = []
    if doc.get("schema") != SCHEMA_NAME:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA_NAME!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version is {doc.get('schema_version')!r}, this tool reads {SCHEMA_VERSION}")
    for key, types in REQUIRED.items():
        if key not in doc:
            problems.append(f"missing {key}")
        elif not isinstance(doc[key], types) or (isinstance(doc[key], bool) and bool not in types):
            problems.append(f"{key} has type {type(doc[key]).__name__}")
    for key in NULLABLE_NUM:
        v = doc.get(key)
        if key not in doc:
            problems.append(f"missing {key}")
        elif v is not None and (not isinstance(v, _NUM) or isinstance(v, bool) or v < 0):
            problems.append(f"{key} must be a non-negative number or null, got {v!r}")
    if problems:
        return problems
    for key in PROVENANCE_KEYS:
        if key not in doc["provenance"]:
            problems.append(f"missing provenance.{key}")
    if doc["partial"] and not doc.get("partial_reason"):
        problems.append("partial result without partial_reason")
    for i, r in enumerate(doc["requests"]):
        if not isinstance(r, dict):
            problems.append(f"requests[{i}] is not an object")
            continue
        for k in REQUEST_KEYS:
            if k not in r:
                problems.append(f"requests[{i}] missing {k}")
    return problems


def _consistency_problems(doc: dict[str, Any]) -> list[str]:
    """Counts and token totals against the listed requests; ITLs against tokens."""
    problems: list[str] = []
    reqs = doc["requests"]
    ok = [r for r in reqs if r["error"] is None]
    if doc["completed"] != len(ok):
        problems.append(f"completed={doc['completed']} but {len(ok)} successful requests listed")
    if doc["failed"] != len(reqs) - len(ok):
        problems.append(f"failed={doc['failed']} but {len(reqs) - len(ok)} failed requests listed")
    if sum(doc["errors"].values()) != doc["failed"]:
        problems.append("errors do not add up to failed")
    if doc["total_output_tokens"] != sum(r["output_tokens"] or 0 for r in ok):
        problems.append("total_output_tokens differs from the sum over successful requests")
    if doc["completed"] + doc["failed"] + doc["not_started"] != doc["num_prompts"]:
        problems.append("completed + failed + not_started != num_prompts")
    for i, r in enumerate(ok):
        counted = r["output_tokens"] and r["output_tokens"] > 1 and r["token_source"] in ("token_ids", "usage")
        if counted and len(r["itl_ms"]) != r["output_tokens"] - 1:
            problems.append(f"requests[{i}] has {len(r['itl_ms'])} ITLs for {r['output_tokens']} tokens")
    return problems


def write_result(path: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
    """Write atomically: a reader sees the old file or the new one, never a torn one."""
    return write_text_atomic(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


def check_output(path: str | os.PathLike[str], flag: str = "--output") -> None:
    """Refuse (BenchError naming `flag` and the path) an output that could not be written,
    before a run rather than after it."""
    try:
        check_writable(path)
    except OSError as e:
        raise BenchError(f"cannot write {flag} {path}: {e.strerror or e}") from None


def load_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A result file as JSON, not yet validated (ResultError names the file)."""
    return read_json_object(path, "result file", ResultError)


def load_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A validated result document; ResultError names the file and the first problem."""
    doc = load_json(path)
    problems = validate_result(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ResultError(f"{path}: {problems[0]}{more}")
    return doc
