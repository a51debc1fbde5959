#!/usr/bin/env bash
# The test suite without a GPU (add --gpu on a machine with one to run the `gpu` label instead).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
if [[ "${1:-}" == "--gpu" ]]; then
  ctest --preset gpu
else
  ctest --preset no-gpu -j "$(nproc)"
fi
