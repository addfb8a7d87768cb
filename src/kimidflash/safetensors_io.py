"""Read and write small safetensors files with the standard library only.

Why not the ``safetensors`` package: ``verify`` runs in serve's preflight, on hosts
and in containers where the project's venv may hold neither torch nor safetensors,
and it only needs a file's header and a few scalars out of a 555 GB checkpoint.
The format is simple and documented: 8 bytes little-endian header length N, N bytes
of JSON (tensor name -> dtype, shape, data_offsets relative to the end of the
header; optional ``__metadata__`` of strings), then the raw little-endian data.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from .errors import SafetensorsError
from .fsio import write_bytes_atomic

# dtype tag -> (struct format of one element, its size); bf16 is decoded by hand.
_SCALAR = {"F64": ("<d", 8), "F32": ("<f", 4), "F16": ("<e", 2), "BF16": (None, 2)}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit; guards against a garbage length


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, ``__metadata__`` included."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise SafetensorsError(f"{p}: too short to be a safetensors file")
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or n > _MAX_HEADER:
                raise SafetensorsError(f"{p}: header length {n} is not plausible; not a safetensors file")
            text = f.read(n)
    except OSError as exc:
        raise SafetensorsError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(text) != n:
        raise SafetensorsError(f"{p}: header truncated ({len(text)} of {n} bytes)")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{p}: header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{p}: header is not a JSON object")
    return header


def tensor_names(path: str | Path) -> list[str]:
    return [k for k in read_header(path) if k != "__metadata__"]


def read_scalar(path: str | Path, name: str) -> float:
    """The value of a one-element floating tensor ``name`` (shape [] or [1])."""
    p = Path(path)
    header = read_header(p)
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise SafetensorsError(f"{p}: has no tensor {name}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _SCALAR:
        raise SafetensorsError(f"{p}: tensor {name} has dtype {dtype}; a scale must be F32, F16, BF16 or F64")
    if not isinstance(shape, list) or math.prod(shape) != 1:
        raise SafetensorsError(f"{p}: tensor {name} has shape {shape}; a per-tensor scale has one element")
    if offsets is None:
        raise SafetensorsError(f"{p}: tensor {name} has no data_offsets")
    fmt, size = _SCALAR[dtype]
    start, end = offsets
    if end - start != size:
        raise SafetensorsError(f"{p}: tensor {name} spans {end - start} bytes, expected {size} for {dtype}")
    with p.open("rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + hlen + start)
        data = f.read(size)
    if len(data) != size:
        raise SafetensorsError(f"{p}: tensor {name} is truncated")
    if fmt is None:  # bf16: the top half of an f32
        return struct.unpack("<f", b"\x00\x00" + data)[0]
    return struct.unpack(fmt, data)[0]


def encode_f32_scalars(tensors: dict[str, float], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file of one-element F32 tensors (shape [1], what vLLM's
    per-tensor KV scale parameters are), in name order."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    data = bytearray()
    for name in sorted(tensors):
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
        data += struct.pack("<f", float(tensors[name]))
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(text)) + text + bytes(data)


def write_f32_scalars(path: str | Path, tensors: dict[str, float], metadata: dict[str, str] | None = None) -> Path:
    return write_bytes_atomic(path, encode_f32_scalars(tensors, metadata))
