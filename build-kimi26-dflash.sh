#!/usr/bin/env bash
# Build the recipe image from Dockerfile.kimi26-dflash through the docker SDK
# (docs/docker.md). Tags NAME:<vllm-version>-<patchset-hash> and NAME:latest,
# prints the patch report. Exit 2: no Docker engine reachable.
#   ./build-kimi26-dflash.sh [CONFIG.env] [--base-image IMG] [--ca-bundle FILE] [--name NAME]
set -euo pipefail
cd "$(dirname "$0")"
. scripts/venv.sh
exec "$KIMIDFLASH_PY" -m kimidflash build "$@"
