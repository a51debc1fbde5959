#!/usr/bin/env bash
# The no-GPU suite under ASan + UBSan, then a timed fuzz of the T4 import, in one command:
#   scripts/sanitize.sh [FUZZ_SECONDS] [--no-nvrtc] [CTEST ARGS...]   FUZZ_SECONDS for fuzz_t4 (default 300; 0: none)
# Configures and builds the "sanitize" preset (clang, build-asan/) as needed, runs `ctest --preset sanitize`
# (every no-GPU test but the three that cannot load an instrumented library; any sanitizer report fails its
# test), then scripts/fuzz.sh FUZZ_SECONDS t4 (findings in build-asan/fuzz/findings/t4/). Exit status 1 when
# a test failed or the fuzzer found something. Not in CI (.ci/run's 20 minutes on 2 cores do not hold it):
# on 2 cores the build is some 25 minutes from scratch, the suite some 25 (17 of it the NVRTC tests;
# `scripts/sanitize.sh 300 --no-nvrtc` leaves them out: some 8), the fuzz what it is given. (The preset's label
# filter takes precedence over a -LE given after it, so --no-nvrtc runs ctest with the preset's filters spelled
# out and nvrtc added.)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-300}
[[ $# -gt 0 ]] && shift
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/sanitize.sh [FUZZ_SECONDS] [CTEST ARGS...]" >&2; exit 2; }
[[ -f build-asan/CMakeCache.txt ]] || cmake --preset sanitize >/dev/null || exit 1
cmake --build build-asan -j "$(nproc)" || exit 1
labels="gpu|nvrtc_full"
if [[ ${1:-} == --no-nvrtc ]]; then labels="gpu|nvrtc_full|nvrtc"; shift; fi
# LSan's tracer crashes at exit on a bogus dynamic-TLS range (clang 14, glibc 2.36; FakeDriver.PlanCache under
# ctest): not scanning dynamic TLS avoids it (docs/usage.md). The test preset sets the same.
export ASAN_OPTIONS=${ASAN_OPTIONS:-intercept_tls_get_addr=0}
status=0
ctest --test-dir build-asan --output-on-failure -LE "$labels" \
  -E '^(python_unit|python_package|python_package_tools|cmake_consumer)$' -j "$(nproc)" "$@" || status=1
if [[ $seconds -gt 0 ]]; then
  bash scripts/fuzz.sh "$seconds" t4 || status=1
fi
exit $status
