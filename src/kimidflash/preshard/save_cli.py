"""`kimidflash preshard-save`'s command line: its options parsed and checked, then `save.py` called."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import RunFailed
from . import save as _domain
from .manifest import WEIGHT_SUFFIX
from .save import MAX_ENV, OUT_ENV, RESULT_PREFIX, register_plugin


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash preshard-save", description=_domain.__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("out", type=Path)
    p.add_argument("--tensor-parallel-size", type=int, required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-shard-bytes", type=int, default=5 << 30)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--attention-backend", default=None)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ[OUT_ENV], os.environ[MAX_ENV] = str(a.out.resolve()), str(a.max_shard_bytes)
    with tempfile.TemporaryDirectory(prefix="kimidflash-preshard-plugin-") as tmp:
        register_plugin(Path(tmp))
        import vllm
        from vllm import LLM

        # The engine must come up for the ranks to load; what it serves afterwards is not needed.
        llm = LLM(
            model=a.model,
            tensor_parallel_size=a.tensor_parallel_size,
            dtype=a.dtype,
            enforce_eager=True,
            max_model_len=a.max_model_len,
            trust_remote_code=a.trust_remote_code,
            attention_backend=a.attention_backend,
        )
        del llm
    missing = [r for r in range(a.tensor_parallel_size) if not list(a.out.glob(f"*-rank-{r}-part-*{WEIGHT_SUFFIX}"))]
    if missing:
        raise RunFailed(
            f"preshard-save: no shard was written for rank(s) {missing}: the loader wrapper did not "
            "run there (was the vLLM general plugin refused? VLLM_PLUGINS must allow it)"
        )
    src = Path(a.model)
    for f in src.iterdir():  # config, tokenizer, chat template, generation config: what vLLM reads beside weights
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIX) and not f.name.endswith(".safetensors.index.json"):
            shutil.copy2(f, a.out / f.name)
    print(RESULT_PREFIX + json.dumps({"vllm_version": vllm.__version__}), flush=True)
    return 0
