"""`python -m kimidflash preshard-bench CONFIG --shards DIR`: how much sooner a server
is ready from pre-sharded weights than from the original checkpoint.

Each round starts the config's server twice through the serve path, once
loading MODEL_DIR and once PRESHARDED_DIR, in alternating order so that a
machine that drifts drifts under both. It records three figures per start:
- the wall time from `serve` to its ready line;
- vLLM's "Loading weights took" (the read);
- vLLM's "Model loading took" (the read plus the post-processing).

Before each start, the page cache of every weight file is dropped
(`posix_fadvise DONTNEED`, which needs no root), so that neither variant
reads the other's warm pages. The ratios come from medians over the rounds.

`--make-model N` first writes, where MODEL_DIR has nothing yet, a Llama of N
layers of random weights (about 0.09 GB a layer in bfloat16: 32 layers make
2.9 GB, enough for loading to matter) with the CPU reference's tokenizer, and
pre-shards it into `--shards` if that is empty.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ..background import serving_process
from ..cpu_reference.tiny import build_tokenizer
from . import manifest

FIGURES = {
    "weights_load_s": re.compile(r"Loading weights took ([0-9.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [0-9.]+ GiB memory and ([0-9.]+) seconds"),
}
SCHEMA = "kimidflash-preshard-loadtime/1"


def make_model(out: Path, layers: int) -> Path:
    """A Llama of random bfloat16 weights (hidden 2048, MLP 5632: ~0.09 GB a layer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=512,
        max_position_embeddings=2048,
        torch_dtype="bfloat16",
    )
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
    return out


def evict(*folders: Path) -> None:
    """Drop the page cache of every weight file (clean pages only; no root needed)."""
    for folder in folders:
        for p in manifest.weight_files(folder):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_start(config: Path, overrides: list[str], log: Path, cold: list[Path]) -> dict[str, float | None]:
    """One server start's figures in seconds; None: vLLM never logged that figure."""
    evict(*cold)
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    with serving_process(config, overrides, log):
        ready = time.monotonic() - t0
    text = log.read_text()
    out: dict[str, float | None] = {"ready_s": round(ready, 2)}
    for name, pattern in FIGURES.items():
        found = pattern.findall(text)
        out[name] = float(found[0]) if found else None
    return out


def ratios(original: dict[str, float | None], presharded: dict[str, float | None]) -> dict[str, float]:
    """original / presharded per figure, for the figures both logged (and not as zero)."""
    out: dict[str, float] = {}
    for k in original:
        a, b = original[k], presharded[k]
        if a and b:
            out[k] = round(a / b, 3)
    return out
