#!/usr/bin/env bash
# The GPU check (make gpu-check): the CUDA tests, then the loader on the GPU (structures/s, atoms/s, H2D
# GB/s beside a pinned torch copy), then the augmentations on CUDA, each result written as it exists to
# $OUT when set, else bench-results/gpu-check/. A few minutes on one GPU; the steps are in scripts/gpu_check.py.
# Usage: scripts/gpu-check.sh [PYTHON] [gpu_check.py options, e.g. --budget-s 300]
set -euo pipefail
PY=${1:-python3}
shift || true
cd "$(dirname "$0")/.."
exec "$PY" scripts/gpu_check.py --python "$PY" "$@"
