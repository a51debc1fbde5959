#!/usr/bin/env bash
# The SASS of representative variants holds the instructions the family is about:
# fa2_mma: tensor-core HMMA fed by LDSM (ldmatrix) and LDGSTS (cp.async); fa2_simt and fa1_simt: FFMA, LDGSTS,
# no HMMA; fa2_wgmma_bwd (sm_90 target, built as sm_90a): warpgroup HGMMA, no HMMA.
set -u
shopt -s nullglob
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
export PATH="$(dirname "$CUOBJDUMP"):$PATH"  # cuobjdump runs the nvdisasm beside it
check() {  # check <name> <space json> <arch> <must have...> -- <must not have...>
  local name=$1 space=$2 arch=$3; shift 3
  echo "$space" >"$tmp/$name.json"
  "$FLASHTUNE" compile-check "$tmp/$name.json" --arch "$arch" --save-cubins "$tmp/$name" >"$tmp/$name.log" 2>&1 \
    || { echo "FAIL: compile $name"; cat "$tmp/$name.log"; fail=1; return; }
  local n=0
  for cubin in "$tmp/$name"/*.cubin; do
    n=$((n + 1))
    "$CUOBJDUMP" -sass "$cubin" >"$tmp/sass.txt" || { echo "FAIL: cuobjdump $cubin"; fail=1; continue; }
    local absent=0
    for op in "$@"; do
      if [[ $op == -- ]]; then absent=1; continue; fi
      local count
      count=$(grep -c "\b$op" "$tmp/sass.txt")
      if [[ $absent -eq 0 && $count -eq 0 ]]; then echo "FAIL: $name $arch $(basename "$cubin"): no $op"; fail=1; fi
      if [[ $absent -eq 1 && $count -ne 0 ]]; then echo "FAIL: $name $arch $(basename "$cubin"): $count x $op"; fail=1; fi
    done
    echo "$name $arch: $(grep -c '\bHGMMA' "$tmp/sass.txt") HGMMA, $(grep -c '\bHMMA' "$tmp/sass.txt") HMMA, $(grep -c '\bLDSM' "$tmp/sass.txt") LDSM, $(grep -c '\bLDGSTS' "$tmp/sass.txt") LDGSTS, $(grep -c '\bFFMA' "$tmp/sass.txt") FFMA, $(grep -c '\bMUFU.EX2' "$tmp/sass.txt") MUFU.EX2"
  done
  [[ $n -gt 0 ]] || { echo "FAIL: $name: nothing compiled"; fail=1; }
}
for arch in sm_80 sm_90; do
  check simt '{"family":"fa2_simt","params":{"BLOCK_M":[128],"BLOCK_N":[64],"TM":[8],"TN":[8],"KV_STAGES":[1]},"head_dims":[64],"causal":[false]}' \
    $arch FFMA LDGSTS MUFU.EX2 -- HMMA
  check fa1 '{"family":"fa1_simt","params":{"BLOCK_M":[64],"BLOCK_N":[32],"TM":[4],"TN":[4],"Q_STAGES":[2],"Q_SPLIT":[1]},"head_dims":[64],"causal":[true]}' \
    $arch FFMA LDGSTS MUFU.EX2 -- HMMA
  if [[ -f "$SRC/templates/fa2_mma.cuh" ]]; then
    check mma '{"family":"fa2_mma","params":{"BLOCK_M":[128],"BLOCK_N":[64],"WARPS":[4],"STAGES":[2]},"head_dims":[128],"causal":[true],"dtypes":["bf16","fp16"]}' \
      $arch HMMA LDSM LDGSTS MUFU.EX2
  fi
done
check wgmma '{"family":"fa2_wgmma_bwd","params":{"BLOCK_M":[64],"BLOCK_N":[128],"SPLIT":[0],"STAGES":[2],"DQ_RED":[0]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]}' \
  sm_90 HGMMA LDGSTS MUFU.EX2 -- HMMA
[[ $fail -eq 0 ]] && echo "sass_check: all passed"
exit $fail
