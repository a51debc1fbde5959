#!/usr/bin/env bash
# One call on the lent GPU machine: build, then one stage, results under $OUT.
#   tests  - the `gpu` CTest label (fault isolation, every variant validated on ragged shapes)
#   sweep  - tune fa2_simt and naive on the standard grid, torch SDPA baseline in the same run,
#            comparison CSV, generated headers; the DB without cubins goes back in a tarball
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stage=${1:?stage: tests or sweep}
log() { echo "== $(date +%T) $*"; }

log build
extra=()
# The device image has libsqlite3.so.0 but not its header: a carried copy of the header (.devdeps,
# never committed) stands in for the -dev package there.
if [[ ! -f /usr/include/sqlite3.h && -f .devdeps/include/sqlite3.h ]]; then
  extra=(-DSQLite3_INCLUDE_DIR=$PWD/.devdeps/include -DSQLite3_LIBRARY=/usr/lib/x86_64-linux-gnu/libsqlite3.so.0)
fi
if ! { cmake --preset release -DFLASHTUNE_BENCHMARKS=OFF "${extra[@]}" && cmake --build build -j"$(nproc)"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
ft=build/flashtune
$ft devices || exit 1
slug=$($ft devices --slug)

case $stage in
tests)
  log "ctest gpu"
  VALIDATE_DB=$OUT/validate.db ctest --preset gpu 2>&1 | tee "$OUT/ctest_gpu.log"
  ;;
sweep)
  rep=reports/$slug
  mkdir -p "$rep"
  db=$rep/results.db
  for space in naive fa2_simt; do
    log "tune $space"
    $ft tune configs/spaces/$space.json configs/problems/anchors_fp32.json --db "$db" 2>&1 | tail -5
  done
  log "sdpa baseline"
  python3 experiments/sdpa_baseline.py configs/problems/anchors_fp32.json --backend efficient --out "$rep/sdpa_efficient_fp32.csv" 2>&1 | tail -8
  $ft best --db "$db" --family fa2_simt --csv >"$rep/best_fa2_simt.csv"
  python3 experiments/compare.py "$rep/best_fa2_simt.csv" "$rep/sdpa_efficient_fp32.csv" --out "$rep/fa2_simt_vs_sdpa.csv"
  $ft best --db "$db" --family naive --csv >"$rep/best_naive.csv"
  $ft emit --db "$db" --out configs/generated
  $ft drop-cubins --db "$db"
  ls -la "$rep"
  tar czf "$OUT/sweep.tar.gz" "$rep" configs/generated
  ;;
esac
log done
