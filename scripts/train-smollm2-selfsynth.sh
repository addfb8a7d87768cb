#!/usr/bin/env bash
# Continue the shipped SmolLM2 DFlash drafter on the conversations the target wrote itself
# (configs/train-smollm2-selfsynth.json, data in drafters/smollm2-selfsynth/), keep the checkpoint that
# walks best on the held-out ones, export it, then A/B it against the shipped drafter and no
# speculation on heldout-mix, split into its three sources. Resumable: run it again after a stop.
#
#   scripts/train-smollm2-selfsynth.sh [RUN_DIR]
#
# Training runs in wall-clock chunks (TRAIN_CHUNK_S, default 1200 s) until train.steps or until
# TRAIN_STEPS (a smaller stop for one session); the A/B writes benchmarks/drafter/selfsynth-vs-shipped/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
config=configs/train-smollm2-selfsynth.json
cache="${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}"
run="${1:-$cache/train-runs/smollm2-135m-dflash-selfsynth}"
stop="${TRAIN_STEPS:-$(python3 -c "import json; print(json.load(open('$config'))['train']['steps'])")}"
./train-drafter.sh "$config" setup regen capture --run-dir "$run"
until [ -f "$run/loss-history.json" ] && python3 -c "import json,sys; h=json.load(open('$run/loss-history.json')); \
sys.exit(0 if h[-1]['step'] >= $stop else 1)" 2>/dev/null; do
  resume=(); [ -f "$run/checkpoints/last.pt" ] && resume=(--resume)
  ./train-drafter.sh "$config" train "${resume[@]}" --skip-setup --max-steps "$stop" \
    --max-seconds "${TRAIN_CHUNK_S:-1200}" --run-dir "$run"
done
./train-drafter.sh "$config" eval export --skip-setup --run-dir "$run"
. scripts/venv.sh
prompts="$cache/prompts/real"
# heldout-mix's own prompts, by the set each came from (real-prompts writes them as heldout-mix-<set>);
# where no BIG-bench archive can be had, the HumanEval and MT-bench parts alone, said so here
if [ ! -s "$prompts/heldout-mix-humaneval.jsonl" ]; then
  "$KIMIDFLASH_PY" -m kimidflash real-prompts "$prompts" || {
    echo "train-smollm2-selfsynth: no BIG-bench archive; the A/B runs on heldout-mix's HumanEval and MT-bench parts" >&2
    "$KIMIDFLASH_PY" -m kimidflash real-prompts "$prompts" --no-bigbench
  }
fi
categories=()
for set in bigbench-heldout humaneval mt-bench; do
  [ -s "$prompts/heldout-mix-$set.jsonl" ] && categories+=(--category "${set%-heldout}=$prompts/heldout-mix-$set.jsonl")
done
"$KIMIDFLASH_PY" -m kimidflash ab configs/cpu-reference.env --none \
  --drafter selfsynth=drafters/smollm2-135m-dflash-selfsynth --drafter shipped=drafters/smollm2-135m-dflash --k 3 \
  "${categories[@]}" --concurrency 1 --sessions "${AB_SESSIONS:-12}" \
  --max-tokens 64 --warmup 2 --rounds 3 --interleave --out benchmarks/drafter/selfsynth-vs-shipped
