#!/usr/bin/env bash
# Parameter sweep, run on the serving host like serve.sh:
#   kimi26-vllm-dflash-sweep.sh CONFIG.env --grid NUM_SPECULATIVE_TOKENS=1,2,3 --concurrency 1 8 --out DIR
# Each point is served through serve.sh's path and benchmarked; re-run to resume. --help for the options.
set -euo pipefail
. "$(dirname "$0")/../scripts/venv.sh"
exec "$KIMIDFLASH_PY" -m kimidflash sweep "$@"
