"""`kimidflash preshard-bench`'s command line: its options parsed and checked, then `loadtime.py` called."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from .. import __version__
from ..background import sigterm_as_interrupt
from ..bench.provenance import host_info
from ..cliargs import add_config
from ..config import load_config
from ..errors import PreshardError
from ..fsio import git_info, utc_now, write_json_atomic
from ..paths import REPO_ROOT, portable, portable_argv
from . import loadtime as _domain
from . import manifest
from .cli import preshard
from .loadtime import SCHEMA, make_model, one_start, ratios


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash preshard-bench", description=_domain.__doc__.splitlines()[0])
    add_config(p, type=Path, set_help=None)
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
