"""The pre-sharded checkpoint's manifest: what it was made from and of, checked before serving.

Light (stdlib and our leaf modules): preflight reads it on the serving host, the saver's caller
writes it. A pre-sharded checkpoint only loads into the same tensor-parallel
size and, its tensors being vLLM's own parameter layout, the same vLLM
release; the manifest records both, and every file with its size and sha256.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TypedDict

from ..fsio import read_json_object, sha256_file, utc_now
from ..paths import portable

MANIFEST = "kimidflash-preshard.json"
SCHEMA = "kimidflash-preshard/1"
WEIGHT_SUFFIX = ".safetensors"


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's weight files (the large ones) in `folder`."""
    return sorted(folder.glob(f"*{WEIGHT_SUFFIX}"))


class _ListedFile(TypedDict):
    """One file of the source checkpoint, as source_summary lists it."""

    name: str
    size: int


def source_summary(src: Path) -> dict[str, Any]:
    """A summary that changes when the source checkpoint does, without reading its
    weights (hundreds of GB): every file's name and size, and the sha256 of the
    small files that say what the weights are (config, index, tokenizer)."""
    files = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: p.relative_to(src).as_posix())
    listing: list[_ListedFile] = [{"name": p.relative_to(src).as_posix(), "size": p.stat().st_size} for p in files]
    small = {e["name"]: sha256_file(src / e["name"]) for e in listing if not e["name"].endswith(WEIGHT_SUFFIX)}
    digest = hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()
    return {
        "path": portable(src),
        "files": len(listing),
        "bytes": sum(e["size"] for e in listing),
        "listing_sha256": digest,
        "metadata_sha256": small,
    }


def build(
    out: Path,
    src: Path,
    *,
    tensor_parallel_size: int,
    vllm_version: str,
    dtype: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of the checkpoint in `out` (every file hashed), not yet written."""
    files = sorted(
        (p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST), key=lambda p: p.relative_to(out).as_posix()
    )
    return {
        "schema": SCHEMA,
        "created": utc_now(),
        "tensor_parallel_size": tensor_parallel_size,
        "vllm_version": vllm_version,
        "dtype": dtype,
        "source": source_summary(src),
        "files": [
            {"name": p.relative_to(out).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)} for p in files
        ],
        **(extra or {}),
    }


def read(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {folder} was not made by `kimidflash preshard` (or its run did not finish)"
        )
    doc = read_json_object(path, MANIFEST)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    return doc


def problems(folder: Path, *, tensor_parallel_size: int, vllm_version: str, hashes: bool = False) -> list[str]:
    """Why `folder` cannot be served at this TP size by this vLLM; [] when it can.
    Sizes are always checked; contents only with `hashes` (it reads every byte)."""
    try:
        doc = read(folder)
    except (FileNotFoundError, ValueError) as e:
        return [str(e)]
    out = []
    if doc["tensor_parallel_size"] != tensor_parallel_size:
        out.append(
            f"pre-sharded for TENSOR_PARALLEL_SIZE={doc['tensor_parallel_size']}, the config serves "
            f"{tensor_parallel_size}: pre-shard again at {tensor_parallel_size}"
        )
    if doc["vllm_version"] != vllm_version:
        out.append(
            f"pre-sharded by vLLM {doc['vllm_version']}, the config pins {vllm_version}: the shards hold "
            "that release's parameter layout; pre-shard again with the pinned vLLM"
        )
    ranks = {f["name"].split("-rank-")[1].split("-")[0] for f in doc["files"] if "-rank-" in f["name"]}
    if ranks != {str(r) for r in range(doc["tensor_parallel_size"])}:
        out.append(f"the manifest lists shards for ranks {sorted(ranks)}, not 0..{doc['tensor_parallel_size'] - 1}")
    for f in doc["files"]:
        p = folder / f["name"]
        if not p.is_file():
            out.append(f"{f['name']} is missing")
        elif p.stat().st_size != f["size"]:
            out.append(
                f"{f['name']} is {p.stat().st_size} bytes, the manifest says {f['size']} (truncated or replaced)"
            )
        elif hashes and sha256_file(p) != f["sha256"]:
            out.append(f"{f['name']} does not match its sha256 in the manifest")
    return out
