#!/usr/bin/env bash
# Run the test suite; installs what it needs first. Fast tier only: scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
exec "$KIMIDFLASH_PY" -m pytest "$@"
