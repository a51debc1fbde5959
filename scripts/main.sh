#!/usr/bin/env bash
# The main job: tune the default space on GPU 0, write the DB, the headers and a summary.
# Without a GPU: compile and prune every variant, print the resource table, say so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
ft=build/flashtune
if ! $ft devices; then
  echo "main: no GPU on this machine: compiling and pruning the default spaces (sm_90), no kernel runs" >&2
  $ft tune configs/spaces/fa2_simt.json configs/problems/anchors_fp32.json --db build/nogpu.db --arch sm_90
  exit 0
fi
slug=$($ft devices --slug)
out=reports/$slug
mkdir -p "$out"
db=$out/results.db
for space in fa2_simt naive; do
  $ft tune configs/spaces/$space.json configs/problems/anchors_fp32.json --db "$db"
done
$ft emit --db "$db" --out configs/generated
$ft best --db "$db" | tee "$out/summary.txt"
echo "main: results in $db, headers in configs/generated/, summary in $out/summary.txt"
