#!/usr/bin/env bash
# One call on the lent GPU machine: build, then one stage, results under $OUT.
#   tests  - the `gpu` CTest label (fault isolation, every variant validated on ragged shapes)
#   sweep-simt - tune fa2_simt and naive on the fp32 standard grid, torch SDPA baseline in the same run
#   sweep-mma  - tune fa2_mma on the bf16 18-point grid, then re-time the tuned best, FA2's fixed table,
#                torch flash and cuDNN side by side; tolerance probe
#   sweep-bwd  - tune fa2_simt_bwd on the fp32 grid beside torch SDPA efficient's backward
#   every sweep: comparison CSVs and generated headers; the DB without cubins comes back in a tarball
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stage=${1:?stage: tests, sweep-simt, sweep-mma or sweep-bwd}
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
sweep-simt)
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
  tar czf "$OUT/sweep.tar.gz" "$rep" configs/generated
  ;;
sweep-bwd)
  rep=reports/$slug
  mkdir -p "$rep"
  db=$rep/results.db
  log "tune fa2_simt_bwd"
  $ft tune configs/spaces/fa2_simt_bwd.json configs/problems/anchors_bwd_fp32.json --db "$db" 2>&1 | tail -4
  log "sdpa baseline (backward)"
  python3 experiments/sdpa_baseline.py configs/problems/anchors_bwd_fp32.json --backend efficient --out "$rep/sdpa_efficient_fp32_bwd.csv" 2>&1 | tail -8
  $ft best --db "$db" --family fa2_simt_bwd --csv >"$rep/best_fa2_simt_bwd.csv"
  python3 experiments/compare.py "$rep/best_fa2_simt_bwd.csv" "$rep/sdpa_efficient_fp32_bwd.csv" --out "$rep/bwd_vs_sdpa.csv"
  $ft emit --db "$db" --out configs/generated
  $ft drop-cubins --db "$db"
  tar czf "$OUT/sweep.tar.gz" "$rep" configs/generated
  ;;
sweep-mma)
  rep=reports/$slug
  mkdir -p "$rep"
  db=$rep/results.db
  log "tune fa2_mma"
  $ft tune configs/spaces/fa2_mma.json configs/problems/anchors_bf16.json --db "$db" 2>&1 | tail -4
  log "forward comparison"
  python3 experiments/fwd_vs_sdpa.py --db "$db" --problems configs/problems/anchors_bf16.json --out "$rep/fwd_vs_sdpa.csv" 2>"$OUT/fwd_vs_sdpa.log"
  log "tolerance probe"
  python3 experiments/tolerance_probe.py --out "$rep/tolerance_probe.csv" >"$OUT/probe.log" 2>&1
  $ft best --db "$db" --family fa2_mma --csv >"$rep/best_fa2_mma.csv"
  $ft emit --db "$db" --out configs/generated
  $ft drop-cubins --db "$db"
  tar czf "$OUT/sweep.tar.gz" "$rep" configs/generated
  ;;
esac
log done
