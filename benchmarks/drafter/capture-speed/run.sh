#!/usr/bin/env bash
# capture speed on this CPU: the same 192 regen records (lines 13,789-13,980) captured three ways
set -euo pipefail
cd "$(dirname "$0")/../../.."
export KIMIDFLASH_CACHE=${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}
for v in "fp32-one-forward float32 1000000" "fp32-grouped float32 4096" "bf16-grouped bfloat16 4096"; do
  set -- $v
  R=$KIMIDFLASH_CACHE/train-runs/capspeed-$1
  rm -rf "$R"; mkdir -p "$R"
  gunzip -c drafters/smollm2-135m-dflash-data/regen.jsonl.gz | sed -n 13789,13980p > "$R/regen.jsonl"
  ./train-drafter.sh configs/train-cpu-reference.json setup capture --run-dir "$R" \
    --set data.prompts=synthetic:48240 --set capture.compute_dtype=$2 --set capture.forward_tokens=$3
  mkdir -p benchmarks/drafter/capture-speed
  cp "$R/manifest.json" benchmarks/drafter/capture-speed/manifest-$1.json
done
