#!/usr/bin/env bash
# The GPU check: CUDA tests, then a short GPU benchmark (DALI loader on the GPU against a plain pinned
# copy). Takes a few minutes on one GPU. Usage: scripts/gpu-check.sh [PYTHON]
set -euo pipefail
PY=${1:-python3}
cd "$(dirname "$0")/.."
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu-check needs a CUDA GPU and a CUDA build of torch")'
"$PY" -c 'import torch; print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)'
echo "== CUDA tests"
"$PY" -m pytest -q -m gpu tests
echo "== GPU benchmark"
mkdir -p bench-results
"$PY" -m dali_alchemi.cli h2d --n 20000 --layouts window,blob --json bench-results/gpu-check.json
echo "== GPU augmentation cost"
"$PY" -m dali_alchemi.cli augment-cost --device cuda --repeats 20
