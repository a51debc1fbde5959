#!/usr/bin/env bash
# The test suite without a GPU: unit tests, CLI tests and NVRTC compiles of a covering sample of every
# space (CI, .ci/run). --full-compile: every variant of every space through NVRTC (label nvrtc_full:
# thousands of compiles, for a machine with many cores). --gpu (on the GPU machine): the `gpu` label,
# then the full compile.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export FLASHTUNE_SETUP_TESTS=1  # setup.sh installs what the tests alone need (Slurm for slurm_cluster)
source scripts/setup.sh
case "${1:-}" in
  --gpu) ctest --preset gpu && ctest --preset nvrtc-full ;;
  --full-compile) ctest --preset nvrtc-full ;;
  "") ctest --preset no-gpu -j "$(nproc)" ;;
  *) echo "usage: scripts/test.sh [--gpu | --full-compile]" >&2; exit 2 ;;
esac
