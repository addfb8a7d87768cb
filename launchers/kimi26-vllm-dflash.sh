#!/usr/bin/env bash
# Standard launcher, run where vLLM is installed (the image, a venv, a ROCm host):
#   kimi26-vllm-dflash.sh CONFIG.env [--set KEY=VALUE]...   render the config here, then exec vLLM
#   kimi26-vllm-dflash.sh -- vllm serve MODEL ...           exec a command rendered by serve.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m kimidflash launch "$@"
