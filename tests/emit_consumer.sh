#!/usr/bin/env bash
# emit -> nvcc: a generated header set is consumed by a real build that instantiates the chosen
# fa2_simt kernel, and the device -> arch -> default fallback picks what it should.
set -u
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$FIXTURE_TOOL" "$tmp/fixture.db" || exit 1

# best reproduces the stored figures without a GPU.
"$FLASHTUNE" best --db "$tmp/fixture.db" --csv >"$tmp/best.csv" || { echo "FAIL: best"; exit 1; }
grep -q '"NVIDIA H100 80GB HBM3",fa2_simt,fwd,2,16,3000,3000,64,fp32,0,"BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2",3.000000' "$tmp/best.csv" \
  || { echo "FAIL: best.csv lacks the expected winner:"; cat "$tmp/best.csv"; fail=1; }

"$FLASHTUNE" emit --db "$tmp/fixture.db" --out "$tmp/gen" >/dev/null || { echo "FAIL: emit"; exit 1; }

consume() {  # consume <gen dir> <device> <arch> <expected line fragment>
  local gen=$1 device=$2 arch=$3 want=$4
  "$NVCC" -std=c++17 -arch=sm_90 -I"$SRC/templates" -I"$gen" "-DFT_DEVICE=\"$device\"" "-DFT_ARCH=\"$arch\"" \
    "$SRC/tests/consumer/consumer.cu" -o "$tmp/consumer" 2>"$tmp/nvcc.log" \
    || { echo "FAIL: nvcc for $device / $arch:"; cat "$tmp/nvcc.log"; fail=1; return; }
  "$tmp/consumer" >"$tmp/run.log" 2>&1 || { echo "FAIL: consumer exited non-zero"; cat "$tmp/run.log"; fail=1; return; }
  grep -q -- "$want" "$tmp/run.log" || { echo "FAIL: $device/$arch: want '$want', got:"; cat "$tmp/run.log"; fail=1; }
}
consume "$tmp/gen" "NVIDIA H100 80GB HBM3" sm_90 "BLOCK_M=64 BLOCK_N=64 TM=4 TN=4 KV_STAGES=2 (from device table"
consume "$tmp/gen" "Some Other GPU" sm_90 "(from arch table"
consume "$tmp/gen" "Some Other GPU" sm_80 "BLOCK_M=64 BLOCK_N=32 TM=4 TN=4 KV_STAGES=2 (from default table"

# Every committed results DB still emits headers that compile.
for db in "$SRC"/reports/*/results.db; do
  [[ -f "$db" ]] || continue
  "$FLASHTUNE" emit --db "$db" --out "$tmp/committed" >/dev/null || { echo "FAIL: emit $db"; fail=1; continue; }
  device=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(\"select device_name from results where status='ok' limit 1\").fetchone()[0])" "$db")
  # The consumer asks for fa2_simt d64 fp32: a DB without such rows (a bf16-only sweep) answers from
  # another table, and its header must still compile.
  simt=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(\"select count(*) from results where status='ok' and family='fa2_simt' and head_dim=64 and dtype='fp32'\").fetchone()[0])" "$db")
  if [[ $simt -gt 0 ]]; then consume "$tmp/committed" "$device" sm_90 "(from device table"
  else consume "$tmp/committed" "$device" sm_90 "(from "; fi
done
[[ $fail -eq 0 ]] && echo "emit_consumer: all passed"
exit $fail
