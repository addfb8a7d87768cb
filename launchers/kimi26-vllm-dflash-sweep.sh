#!/usr/bin/env bash
# Parameter sweep, run where serve.sh runs:
#   kimi26-vllm-dflash-sweep.sh CONFIG.env --grid NUM_SPECULATIVE_TOKENS=1,2,3 --concurrency 1 8 --out DIR
# Each point is served through serve.sh's path and benchmarked; re-run to resume. --help for the options.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -f "$root/scripts/venv.sh" ]; then  # a checkout: the project's venv, as serve.sh uses
  . "$root/scripts/venv.sh"
else  # the image: the package beside this launcher
  export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" KIMIDFLASH_PY=python3
fi
exec "$KIMIDFLASH_PY" -m kimidflash sweep "$@"
