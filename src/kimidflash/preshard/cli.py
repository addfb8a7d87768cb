"""`python -m kimidflash preshard CONFIG --out DIR` (payload/preshard_kimi26.py): pre-shard
the config's MODEL_DIR for its TENSOR_PARALLEL_SIZE, DTYPE and vLLM, once, so each
start loads per-rank shards instead of the whole checkpoint.

The saver runs in the config's vLLM environment (`preshard-save`), into a
temporary folder beside DIR that takes DIR's place only when the shards, the
copied config and tokenizer files and the manifest are all written: an
interrupted run leaves nothing that looks complete. An existing DIR is
replaced only with `--force`; free disk space is checked first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from ..checkpoint_layout import read_config
from ..cliargs import add_config
from ..config import load_config
from ..config.model import Config
from ..errors import LayoutError, PreshardError
from ..fsio import atomic_dir, git_info, write_json_atomic
from ..paths import REPO_ROOT, portable
from ..prepare import launch_env, prepare, vllm_python
from ..render import render
from . import manifest
from .save import RESULT_PREFIX

# Bytes per parameter of the serving dtype against the checkpoint's, for the disk estimate.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADROOM = 1.10  # safetensors headers, alignment, the copied small files


def needed_bytes(src: Path, dtype: str) -> int:
    """The shards hold the source's weights, at the serving dtype when one is forced."""
    weights = sum(p.stat().st_size for p in manifest.weight_files(src))
    try:
        src_dtype = (read_config(src) or {}).get("torch_dtype", "")
    except LayoutError:  # the copy itself will name the bad file; the estimate assumes no dtype change
        src_dtype = ""
    ratio = (
        DTYPE_BYTES.get(dtype, 0) / DTYPE_BYTES[src_dtype] if src_dtype in DTYPE_BYTES and dtype in DTYPE_BYTES else 1
    )
    return int(weights * max(ratio, 1) * HEADROOM)


def check_inputs(config: Config, out: Path, force: bool) -> Path:
    src = Path(config.model_dir)
    if not (src / "config.json").is_file():
        raise PreshardError(f"MODEL_DIR {src} holds no config.json: nothing to pre-shard")
    if not manifest.weight_files(src):
        raise PreshardError(f"MODEL_DIR {src} holds no *.safetensors weights")
    if out.exists() and not force:
        raise PreshardError(f"{out} exists; pass --force to replace it (the old one stays until the new one is whole)")
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise PreshardError(f"--out {out} is inside MODEL_DIR {src}; write the shards elsewhere")
    out.parent.mkdir(parents=True, exist_ok=True)
    need, free = needed_bytes(src, config.dtype), shutil.disk_usage(out.parent).free
    if free < need:
        raise PreshardError(
            f"{out.parent} has {free / 2**30:.1f} GiB free; pre-sharding {src} needs about "
            f"{need / 2**30:.1f} GiB (its weights at DTYPE={config.dtype}, plus 10%)"
        )
    return src


def run_saver(config: Config, src: Path, tmp: Path, max_shard_bytes: int) -> str:
    """Run `preshard-save` in the config's vLLM environment; vLLM's version as it reports it."""
    argv = [
        vllm_python(config),
        "-m",
        "kimidflash",
        "preshard-save",
        str(src),
        str(tmp),
        "--tensor-parallel-size",
        str(config.tensor_parallel_size),
        "--dtype",
        config.dtype,
        "--max-model-len",
        str(min(config.max_model_len, 4096)),
        "--max-shard-bytes",
        str(max_shard_bytes),
    ]
    if config.trust_remote_code:
        argv.append("--trust-remote-code")
    if config.attention_backend:  # the load runs the backend's weight processing (AMX MLA: bfloat16 only)
        argv += ["--attention-backend", config.attention_backend]
    proc = subprocess.run(
        argv,
        env={**launch_env(config), **render(config).env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = proc.stdout.splitlines()
    result = next((ln[len(RESULT_PREFIX) :] for ln in lines if ln.startswith(RESULT_PREFIX)), None)
    if proc.returncode != 0 or result is None:
        tail = "\n".join("  " + ln for ln in lines[-25:])
        raise PreshardError(f"the saver failed (exit {proc.returncode}); its last lines:\n{tail}")
    return json.loads(result)["vllm_version"]


def preshard(config: Config, out: Path, *, force: bool = False, max_shard_bytes: int = 5 << 30) -> dict:
    src = check_inputs(config, out, force)
    prepare(config)  # the managed vLLM venv, the CPU reference models
    with atomic_dir(out) as tmp:
        version = run_saver(config, src, tmp, max_shard_bytes)
        doc = manifest.build(
            tmp,
            src,
            tensor_parallel_size=config.tensor_parallel_size,
            vllm_version=version,
            dtype=config.dtype,
            extra={"config": portable(config.path) if config.path else None, "git": git_info(REPO_ROOT)},
        )
        write_json_atomic(tmp / manifest.MANIFEST, doc)
    return doc


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash preshard", description=__doc__.splitlines()[0])
    add_config(
        p,
        "the env file whose MODEL_DIR, TENSOR_PARALLEL_SIZE, DTYPE and vLLM are used",
        set_help="override one key (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="the pre-sharded checkpoint's folder")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest file per rank, in GiB (default 5)")
    a = p.parse_args(argv)
    if not a.max_shard_gb > 0:
        raise PreshardError(f"--max-shard-gb must be positive, got {a.max_shard_gb}")
    config = load_config(a.config, a.set)
    doc = preshard(config, a.out, force=a.force, max_shard_bytes=int(a.max_shard_gb * 2**30))
    size = sum(f["size"] for f in doc["files"])
    print(
        f"preshard: {len(doc['files'])} files, {size / 2**30:.2f} GiB, TP {doc['tensor_parallel_size']}, "
        f"vLLM {doc['vllm_version']} -> {a.out} (manifest {manifest.MANIFEST})"
    )
    return 0
