#!/usr/bin/env bash
# Installs what a fresh Debian machine with the CUDA toolkit lacks, then configures and builds.
# Sourced by main.sh and test.sh; safe to run again (installs nothing that is present).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need=()
have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
if command -v dpkg >/dev/null && command -v apt-get >/dev/null; then
  for p in cmake ninja-build g++ libsqlite3-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev python3; do
    have_pkg "$p" || need+=("$p")
  done
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  if ((${#need[@]})); then
    echo "setup: installing ${need[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # The Slurm test (tests/slurm_shards.sh cluster) starts its own single-node Slurm: for test.sh only.
  # Apart from the rest, so that a machine that cannot install it fails that one test (which says why),
  # not the build.
  slurm=()
  if [[ -n ${FLASHTUNE_SETUP_TESTS:-} ]]; then
    for p in slurmctld slurmd slurm-client munge; do have_pkg "$p" || slurm+=("$p"); done
  fi
  if ((${#slurm[@]})); then
    echo "setup: installing ${slurm[*]} (for the Slurm test)" >&2
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${slurm[@]}" >/dev/null; } ||
      echo "setup: Slurm could not be installed; slurm_cluster will fail saying so" >&2
  fi
fi
# matplotlib for the report plots, into whichever python3 is first on PATH.
if ! python3 -c "import matplotlib" 2>/dev/null; then
  echo "setup: installing matplotlib" >&2
  python3 -m pip install -q matplotlib 2>/dev/null || python3 -m pip install -q --break-system-packages matplotlib
fi
# jsonschema: the T4 export is validated against the published schema (tests/t4_export.py).
if ! python3 -c "import jsonschema" 2>/dev/null; then
  echo "setup: installing jsonschema" >&2
  python3 -m pip install -q jsonschema 2>/dev/null || python3 -m pip install -q --break-system-packages jsonschema
fi
# scikit-build-core, the Python package's build backend, for its offline build test (pip install --no-build-isolation).
if ! python3 -c "import scikit_build_core" 2>/dev/null; then
  echo "setup: installing scikit-build-core" >&2
  python3 -m pip install -q scikit-build-core 2>/dev/null || python3 -m pip install -q --break-system-packages scikit-build-core
fi
# cuobjdump (and the nvdisasm it runs) for the SASS checks: the toolkit's, else NVIDIA's PyPI packages.
if ! command -v cuobjdump >/dev/null && [[ ! -x /usr/local/cuda/bin/cuobjdump ]] &&
   ! python3 -c "import nvidia, os, sys; sys.exit(not any(os.path.exists(os.path.join(p, 'cu13/bin/cuobjdump')) for p in nvidia.__path__))" 2>/dev/null; then
  echo "setup: installing cuobjdump and nvdisasm (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)" >&2
  python3 -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm 2>/dev/null ||
    python3 -m pip install -q --break-system-packages nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
# nvcc must be reachable for the CUDA language (consumer test).
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi

cmake --preset release >/dev/null
cmake --build --preset release
