#!/usr/bin/env bash
# The fuzz targets (tests/fuzz/) under libFuzzer, ASan and UBSan, each for a fixed time.
#   scripts/fuzz.sh [SECONDS] [TARGET...]   SECONDS per target (default 120); targets: problems space experiment t4 store
# Builds the "sanitize" preset (clang; build-asan/) if needed. Each target starts from its committed seed corpus,
# tests/fuzz/corpus/<target>/ (read, never written); what it adds goes to build-asan/fuzz/corpus/<target>/ and an
# input that crashes, leaks, times out (10 s) or takes over 2 GB to build-asan/fuzz/findings/<target>/. Exit status 1
# when any target found something: add the input to the seed corpus (so the fuzz_<target> test replays it), fix it,
# and add a unit test. Not in CI (its 20 minutes hold no sanitizer build): run it on a machine with idle cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-120}
[[ $# -gt 0 ]] && shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(problems space experiment t4 store)
[[ -f build-asan/CMakeCache.txt ]] || cmake --preset sanitize >/dev/null
cmake --build build-asan --target "${targets[@]/#/fuzz_}"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
status=0
for t in "${targets[@]}"; do
  out=build-asan/fuzz; mkdir -p "$out/corpus/$t" "$out/findings/$t"
  dict=(); [[ $t == store ]] || dict=(-dict=tests/fuzz/json.dict)  # the JSON readers' keys and values
  echo "== fuzz_$t: $seconds s"
  if ! build-asan/tests/fuzz/fuzz_$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 "${dict[@]}" \
       -print_final_stats=1 -artifact_prefix="$out/findings/$t/" "$out/corpus/$t" "tests/fuzz/corpus/$t" \
       2>"$out/$t.log"; then
    status=1
    echo "fuzz_$t FOUND something: $(ls "$out/findings/$t" | head -3) (log: $out/$t.log)"
    grep -m3 -E "ERROR|runtime error|fuzz: " "$out/$t.log" || true
  fi
  grep -E "stat::number_of_executed_units|DONE +cov: " "$out/$t.log" | tail -2 || true
done
exit $status
