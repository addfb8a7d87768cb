#!/usr/bin/env bash
# Serve Kimi K2.6 + DFlash: ./serve.sh [configs/X.env] [--dry-run | --preflight-only] [--print-config] [--set KEY=VALUE]
set -euo pipefail
. "$(dirname "$0")/scripts/venv.sh"
exec "$KIMIDFLASH_PY" -m kimidflash serve "$@"
