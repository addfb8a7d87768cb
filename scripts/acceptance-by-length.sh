#!/usr/bin/env bash
# Acceptance by context length on prompts people wrote: humaneval-long (heldout-mix's first HumanEval
# questions after modules of other problems' code, 0 to 18,000 characters) served by
#   - SmolLM2 with the shipped DFlash drafter, against no speculation (MAX_MODEL_LEN 8192), and
#   - the tiny Kimi K2.6 with both its drafters (DFlash, EAGLE-3 MLA), against no speculation,
# k=3, one user, float32, interleaved, ROUNDS rounds (default 3). Each run's report.md has the
# per-kind rows (specbench.md) and the per-prompt-length table from each request's own stats.
#
#   scripts/acceptance-by-length.sh [smollm2|tiny-kimi]...   (default: both)
#
# Writes benchmarks/drafter/length-smollm2/ and benchmarks/drafter/length-tiny-kimi/; --reuse resumes.
# KINDS="ctx-00k ctx-03k ctx-09k" keeps those budgets only (the 18 k one costs most); SMOLLM2_DRAFTERS
# ("LABEL=DIR ...") serves more SmolLM2 drafters beside the shipped one; OUT names another folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
. scripts/venv.sh
prompts="${KIMIDFLASH_CACHE:-$HOME/.cache/kimidflash}/prompts/real"
if [ ! -s "$prompts/humaneval-long.jsonl" ]; then
  "$KIMIDFLASH_PY" -m kimidflash real-prompts "$prompts" --no-bigbench
fi
kinds=()
for k in ${KINDS:-}; do kinds+=(--kind "$k"); done
extra=()
for d in ${SMOLLM2_DRAFTERS:-}; do extra+=(--drafter "$d"); done
common=(--k 3 --none --category "long=$prompts/humaneval-long.jsonl" --by-kind "${kinds[@]}" --concurrency 1
  --sessions "${SESSIONS:-12}" --max-tokens 64 --warmup 1 --rounds "${ROUNDS:-3}" --interleave --reuse)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(smollm2 tiny-kimi)
for t in "${targets[@]}"; do
  case "$t" in
    smollm2)
      "$KIMIDFLASH_PY" -m kimidflash ab configs/cpu-reference.env --drafter shipped=drafters/smollm2-135m-dflash \
        "${extra[@]}" --set MAX_MODEL_LEN=8192 --set MAX_NUM_BATCHED_TOKENS=8192 "${common[@]}" \
        --out "${OUT:-benchmarks/drafter/length-smollm2}" ;;
    tiny-kimi)
      "$KIMIDFLASH_PY" -m kimidflash ab configs/cpu-kimi-tiny.env --drafter dflash=drafters/tiny-kimi-k2.6-dflash \
        --drafter eagle3=drafters/tiny-kimi-k2.6-eagle3 --set MAX_MODEL_LEN=16384 \
        --set MAX_NUM_BATCHED_TOKENS=16384 --set CPU_KVCACHE_SPACE=2 "${common[@]}" \
        --out "${OUT:-benchmarks/drafter/length-tiny-kimi}" ;;
    *) echo "acceptance-by-length: no target $t (smollm2 or tiny-kimi)" >&2; exit 2 ;;
  esac
done
