#!/usr/bin/env bash
# Train the SmolLM2 EAGLE-3 head (configs/train-smollm2-eagle3.json) on data the shipped DFlash drafter
# trained on, then A/B both families on heldout-mix in one run. Resumable: run it again after a stop.
#
#   scripts/train-smollm2-eagle3.sh [RUN_DIR]
#
# Data: the committed synthetic records 13,789-16,788 of drafters/smollm2-135m-dflash-data/regen.jsonl.gz
# (3,000 answered by today's float32 target) copied into the run first, then regen answers the first
# 1,024 prompts of bigbench:train-wide (the ones the shipped drafter's last run trained on). Training is
# wall-clock chunks (TRAIN_CHUNK_S, default 1200 s) so a stopped session loses at most one. The committed
# head (drafters/smollm2-135m-eagle3/) stopped at step 1,451 of 2,000: its README says how it was run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
config=configs/train-smollm2-eagle3.json
run="${1:-${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/train-runs/smollm2-135m-eagle3}"
./train-drafter.sh "$config" setup --run-dir "$run"
[ -s "$run/regen.jsonl" ] || gzip -dc drafters/smollm2-135m-dflash-data/regen.jsonl.gz | sed -n '13789,16788p' > "$run/regen.jsonl"
./train-drafter.sh "$config" regen capture --skip-setup --run-dir "$run"
until [ -f "$run/checkpoints/last.pt" ] && python3 -c "import json,sys; h=json.load(open('$run/loss-history.json')); \
c=json.load(open('$config')); sys.exit(0 if h[-1]['step'] >= c['train']['steps'] else 1)" 2>/dev/null; do
  ./train-drafter.sh "$config" train --resume --skip-setup --max-seconds "${TRAIN_CHUNK_S:-1200}" --run-dir "$run"
done
./train-drafter.sh "$config" eval export --skip-setup --run-dir "$run"
. scripts/venv.sh
"$KIMIDFLASH_PY" -m kimidflash real-prompts "${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/prompts/real"
"$KIMIDFLASH_PY" -m kimidflash ab configs/cpu-reference.env --none \
  --drafter eagle3=drafters/smollm2-135m-eagle3 --drafter dflash=drafters/smollm2-135m-dflash --k 3 \
  --prompts "${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/prompts/real/heldout-mix.jsonl" --concurrency 1 2 4 8 \
  --sessions 16 --max-tokens 64 --warmup 2 --rounds 3 --interleave --out benchmarks/drafter/eagle3-vs-dflash \
  --offline eagle3=drafters/smollm2-135m-eagle3/offline-acceptance.json
