#!/usr/bin/env bash
# Validate an FP8 KV deployment against its BF16-KV twin:
# ./validate-fp8.sh CONFIG [--set KEY=VALUE ...] [--prompts N] [--max-tokens N] [--min-agreement F] [--out DIR]
set -euo pipefail
. "$(dirname "$0")/scripts/venv.sh"
exec "$KIMIDFLASH_PY" -m kimidflash validate-fp8 "$@"
