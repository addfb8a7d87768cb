#!/usr/bin/env bash
# Continue a committed SmolLM2 drafter on the conversations the target wrote itself (data in
# drafters/smollm2-selfsynth/), keep the checkpoint that does best on the held-out ones, export it, then
# A/B it against the shipped DFlash drafter and no speculation on heldout-mix, split into its three
# sources. Resumable: run it again after a stop.
#
#   scripts/train-smollm2-selfsynth.sh [dflash|steered|eagle3|long] [RUN_DIR]
#
# dflash (the default): the shipped DFlash drafter, configs/train-smollm2-selfsynth.json, the best walk kept.
# steered: the same on both folders, drafters/smollm2-selfsynth and drafters/smollm2-selfsynth-steered
#   (configs/train-smollm2-selfsynth-steered.json, 6,000 steps), A/B into selfsynth-steered-vs-shipped/.
# eagle3: the committed EAGLE-3 head, configs/train-smollm2-eagle3-selfsynth.json, the lowest held-out loss kept.
# long: the shipped DFlash drafter on drafters/smollm2-selfsynth-long/ (configs/train-smollm2-selfsynth-long.json),
#   measured by prompt length instead (scripts/acceptance-by-length.sh, one round of the 0, 3 k and 9 k
#   budgets beside the shipped drafter, into benchmarks/drafter/length-smollm2-long/).
# Training runs in wall-clock chunks (TRAIN_CHUNK_S, default 1200 s) until train.steps or until
# TRAIN_STEPS (a smaller stop for one session); the A/B writes benchmarks/drafter/selfsynth-vs-shipped/
# (dflash) or benchmarks/drafter/selfsynth-eagle3-vs-shipped/ (eagle3), or AB_OUT: name a new folder
# when the data has grown, so an earlier run's committed files are not written over. AB_DRAFTERS adds
# arms to the same A/B ("--drafter NAME=DIR ..."), e.g. an earlier run's export, measured in the same rounds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
family="${1:-dflash}"
case "$family" in
  dflash) config=configs/train-smollm2-selfsynth.json; name=smollm2-135m-dflash-selfsynth; ab=selfsynth-vs-shipped ;;
  steered) config=configs/train-smollm2-selfsynth-steered.json; name=smollm2-135m-dflash-selfsynth-steered
    ab=selfsynth-steered-vs-shipped ;;
  eagle3) config=configs/train-smollm2-eagle3-selfsynth.json; name=smollm2-135m-eagle3-selfsynth; ab=selfsynth-eagle3-vs-shipped ;;
  long) config=configs/train-smollm2-selfsynth-long.json; name=smollm2-135m-dflash-selfsynth-long; ab= ;;
  *) echo "train-smollm2-selfsynth: the run is dflash, steered, eagle3 or long, not '$family'" >&2; exit 2 ;;
esac
cache="${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}"
run="${2:-$cache/train-runs/$name}"
stop="${TRAIN_STEPS:-$(python3 -c "import json; print(json.load(open('$config'))['train']['steps'])")}"
./train-drafter.sh "$config" setup regen capture --run-dir "$run"
until [ -f "$run/loss-history.json" ] && python3 -c "import json,sys; h=json.load(open('$run/loss-history.json')); \
sys.exit(0 if h[-1]['step'] >= $stop else 1)" 2>/dev/null; do
  resume=(); [ -f "$run/checkpoints/last.pt" ] && resume=(--resume)
  ./train-drafter.sh "$config" train "${resume[@]}" --skip-setup --max-steps "$stop" \
    --max-seconds "${TRAIN_CHUNK_S:-1200}" --run-dir "$run"
done
./train-drafter.sh "$config" eval export --skip-setup --run-dir "$run"
if [ -z "$ab" ]; then
  KINDS="${KINDS:-ctx-00k ctx-03k ctx-09k}" SMOLLM2_DRAFTERS="long=drafters/$name" ROUNDS="${ROUNDS:-1}" \
    OUT=benchmarks/drafter/length-smollm2-long exec scripts/acceptance-by-length.sh smollm2
fi
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
  --drafter "selfsynth=drafters/$name" --drafter shipped=drafters/smollm2-135m-dflash ${AB_DRAFTERS:-} --k 3 \
  "${categories[@]}" --concurrency 1 --sessions "${AB_SESSIONS:-12}" \
  --max-tokens 64 --warmup 2 --rounds 3 --interleave --out "${AB_OUT:-benchmarks/drafter/$ab}"
