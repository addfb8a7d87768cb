"""`kimidflash validate-fp8`'s command line: its options parsed and checked, then `validate.py` called."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..cliargs import add_config
from ..config import ConfigError, parse_overrides
from ..errors import EXIT_INTERRUPTED, InputError
from ..paths import REPO_ROOT
from . import validate as _domain
from .requests import TOP_K
from .validate import DEFAULT_MIN_AGREEMENT, Options, run, shipped_prompts


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(prog="validate-fp8.sh", description=_domain.__doc__.split("\n\n")[0])
    add_config(p, "an FP8 KV config (KV_CACHE_DTYPE=fp8...)", set_help="override one key (repeatable)")
    p.add_argument("--prompts", type=int, default=len(shipped_prompts()), help="how many shipped prompts (default all)")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy output length per prompt (default 128)")
    p.add_argument(
        "--min-agreement",
        type=float,
        default=DEFAULT_MIN_AGREEMENT,
        help=f"least teacher-forced top-1 agreement to pass (default {DEFAULT_MIN_AGREEMENT})",
    )
    p.add_argument("--out", help="result folder (default benchmarks/fp8/<config>-<kv dtype>-<policy>)")
    p.add_argument(
        "--reference-model",
        help="checkpoint the BF16-KV reference serves (default: MODEL_DIR, or the "
        "checkpoint a KV-scale overlay links to)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=TOP_K,
        help=f"prompt logprobs per position (default {TOP_K}, vLLM's default --max-logprobs)",
    )
    p.add_argument("--bench-sessions", type=int, default=4, help="benchmark requests per server (default 4)")
    p.add_argument(
        "--port", type=int, help="the reference serves on PORT, the FP8 server on PORT+1 (default: free ones)"
    )
    a = p.parse_args(list(argv))
    n_shipped = len(shipped_prompts())
    checks = (
        (1 <= a.prompts <= n_shipped, f"--prompts must be 1..{n_shipped}, got {a.prompts}"),
        (a.max_tokens >= 1, f"--max-tokens must be at least 1, got {a.max_tokens}"),
        (0.0 <= a.min_agreement <= 1.0, f"--min-agreement must be within [0, 1], got {a.min_agreement}"),
        (1 <= a.top_k <= 20, f"--top-k must be 1..20 (vLLM's default --max-logprobs), got {a.top_k}"),
        (a.bench_sessions >= 1, f"--bench-sessions must be at least 1, got {a.bench_sessions}"),
        (a.port is None or 1 <= a.port < 65535, f"--port must be 1..65534, got {a.port}"),
    )
    for ok, msg in checks:
        if not ok:
            raise InputError(msg)
    if not Path(a.config).is_file():
        raise InputError(f"config {a.config}: no such file")
    try:
        overrides = parse_overrides(a.set)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if a.reference_model and not (Path(a.reference_model) / "config.json").is_file():
        raise InputError(f"--reference-model {a.reference_model}: no config.json there")
    if a.out:
        out = Path(a.out)
    else:
        cfg_name = Path(a.config).stem
        dtype = overrides.get("KV_CACHE_DTYPE", "fp8")
        policy = overrides.get("KV_SCALE_POLICY", "config")
        out = REPO_ROOT / "benchmarks" / "fp8" / f"{cfg_name}-{dtype}-{policy}"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    return Options(
        a.config,
        overrides,
        a.prompts,
        a.max_tokens,
        a.min_agreement,
        out.absolute(),
        a.reference_model,
        a.top_k,
        a.bench_sessions,
        a.port,
        ("validate-fp8.sh", *argv),
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv)
    try:
        code, line = run(opts)
    except KeyboardInterrupt:  # the server was stopped on the way out (serving_process)
        print("validate-fp8: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(line)
    return code
