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

import argparse
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..background import serving_process, sigterm_as_interrupt
from ..bench.provenance import host_info
from ..config import load_config
from ..cpu_reference.tiny import build_tokenizer
from ..errors import PreshardError
from ..fsio import git_info, utc_now, write_json_atomic
from ..paths import REPO_ROOT, portable, portable_argv
from . import manifest
from .cli import preshard

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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash preshard-bench", description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("--shards", type=Path, required=True, help="the pre-sharded checkpoint of MODEL_DIR")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--make-model",
        type=int,
        metavar="LAYERS",
        help="write a random Llama of this many layers at "
        "MODEL_DIR (if missing) and pre-shard it into --shards (if missing)",
    )
    p.add_argument("--out", type=Path, required=True, help="the result JSON")
    a = p.parse_args(argv)
    if a.rounds < 1:
        raise PreshardError(f"--rounds must be at least 1, got {a.rounds}")
    cfg = load_config(a.config)
    if a.make_model is not None:
        if not (Path(cfg.model_dir) / "config.json").is_file():
            make_model(Path(cfg.model_dir), a.make_model)
        if not a.shards.exists():
            preshard(cfg, a.shards)
    bad = manifest.problems(a.shards, tensor_parallel_size=cfg.tensor_parallel_size, vllm_version=cfg.vllm_version)
    if bad:
        raise PreshardError(f"--shards {a.shards}: " + "; ".join(bad))
    src, made = Path(cfg.model_dir), manifest.read(a.shards)
    variants = {"original": [], "presharded": [f"PRESHARDED_DIR={a.shards.resolve()}"]}
    runs: dict[str, list[dict[str, float | None]]] = {v: [] for v in variants}
    logs = a.out.parent / (a.out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    with sigterm_as_interrupt():  # a killed benchmark still stops the server it started
        for r in range(a.rounds):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for name in order:
                fig = one_start(a.config, variants[name], logs / f"{name}-r{r + 1}.log", [src, a.shards])
                runs[name].append(fig)
                print(f"preshard-bench: round {r + 1} {name}: {fig}", flush=True)

    def median(values: list[float | None]) -> float | None:  # None: vLLM never logged this figure
        present = [x for x in values if x is not None]
        return round(statistics.median(present), 3) if present else None

    med = {v: {k: median([x[k] for x in rs]) for k in rs[0]} for v, rs in runs.items()}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "date": utc_now(),
        "rounds": a.rounds,
        "runs": runs,
        "median": med,
        "ratio_original_over_presharded": ratios(med["original"], med["presharded"]),
        "model": {
            "path": portable(src),
            "weights_bytes": sum(p.stat().st_size for p in manifest.weight_files(src)),
            "dtype": cfg.dtype,
        },
        "shards": {**made, "files": len(made["files"])},
        "provenance": {
            "tool": "kimidflash preshard-bench",
            "tool_version": __version__,
            "git": git_info(REPO_ROOT),
            "host": host_info(),
            "config": portable(a.config),
            "command": " ".join(portable_argv(["kimidflash", "preshard-bench", *argv])),
            "page_cache": "weight files evicted (posix_fadvise DONTNEED) before every start",
        },
    }
    write_json_atomic(a.out, doc)
    print(f"preshard-bench: medians {doc['median']}; original / presharded {doc['ratio_original_over_presharded']}")
    return 0
