#!/usr/bin/env bash
# The SASS of a representative variant of every family (from `flashtune families --json`, sm_80 and
# sm_90; a Hopper-only family on sm_90, built as sm_90a) holds the instructions the family is about.
# The expectations are per family, below; a family missing from the table fails here.
set -u
shopt -s nullglob
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
export PATH="$(dirname "$CUOBJDUMP"):$PATH"  # cuobjdump runs the nvdisasm beside it
compile() {  # compile <name> <space json> <arch>: the space's cubins into $tmp/<name>; 1 (and FAIL) if it does not
  local name=$1 space=$2 arch=$3
  echo "$space" >"$tmp/$name.json"
  "$FLASHTUNE" compile-check "$tmp/$name.json" --arch "$arch" --save-cubins "$tmp/$name" >"$tmp/$name.log" 2>&1 \
    || { echo "FAIL: compile $name"; cat "$tmp/$name.log"; fail=1; return 1; }
}
check() {  # check <name> <space json> <arch> <must have...> -- <must not have...>
  local name=$1 space=$2 arch=$3; shift 3
  compile "$name" "$space" "$arch" || return
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
# Per family: the variant (space fields after "family") and the instructions it must and must not hold.
expect() {  # expect <family> -> sets space and ops; returns 1 for a family without an entry
  case $1 in
    naive) space='"params":{"THREADS":[256]},"head_dims":[64],"causal":[true]'
      ops=(FFMA MUFU.EX2 -- HMMA) ;;  # scores through global memory: no cp.async, no tensor cores
    fa1_simt) space='"params":{"BLOCK_M":[64],"BLOCK_N":[32],"TM":[4],"TN":[4],"Q_STAGES":[2],"Q_SPLIT":[1]},"head_dims":[64],"causal":[true]'
      ops=(FFMA LDGSTS MUFU.EX2 -- HMMA) ;;
    fa2_simt) space='"params":{"BLOCK_M":[128],"BLOCK_N":[64],"TM":[8],"TN":[8],"KV_STAGES":[1]},"head_dims":[64],"causal":[false]'
      ops=(FFMA LDGSTS MUFU.EX2 -- HMMA) ;;
    fa2_simt_bwd) space='"params":{"BLOCK_M":[32],"BLOCK_N":[64],"TM":[4],"TN":[2],"DQ_MODE":[1]},"head_dims":[64],"causal":[true]'
      ops=(FFMA LDGSTS MUFU.EX2 -- HMMA) ;;
    fa2_mma) space='"params":{"BLOCK_M":[128],"BLOCK_N":[64],"WARPS":[4],"STAGES":[2]},"head_dims":[128],"causal":[true],"dtypes":["bf16","fp16"]'
      ops=(HMMA LDSM LDGSTS MUFU.EX2) ;;
    decode_splitkv) space='"params":{"SPLITS":[16],"BLOCK_N":[64],"WARPS":[4],"STAGES":[2]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]'
      ops=(HMMA LDSM LDGSTS MUFU.EX2) ;;  # partial (cp.async, ldmatrix, mma.sync) and combine kernels in one cubin
    fa2_mma_bwd) space='"params":{"BLOCK_M":[32],"BLOCK_N":[64],"WARPS":[8],"DSPLIT":[2],"STAGES":[2],"DQ_MODE":[1]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]'
      ops=(HMMA LDSM LDGSTS MUFU.EX2) ;;
    fa2_wgmma_bwd) space='"params":{"BLOCK_M":[64],"BLOCK_N":[128],"SPLIT":[0],"STAGES":[2],"DQ_RED":[0]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]'
      ops=(HGMMA LDGSTS MUFU.EX2 -- HMMA) ;;
    fa3_wgmma) space='"params":{"BLOCK_N":[128],"CONSUMERS":[2],"STAGES":[2],"OVERLAP":[1],"PINGPONG":[1],"P_SMEM":[0]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]'
      ops=(HGMMA UTMALDG UTMASTG USETMAXREG MUFU.EX2 -- HMMA LDGSTS) ;;  # TMA in and out, no cp.async
    fa3_wgmma_bwd) space='"params":{"BLOCK_M":[64],"CONSUMERS":[2],"STAGES":[2],"SCHED":[0],"DQ_OVERLAP":[1]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]'
      ops=(HGMMA UTMALDG UBLKCP UBLKRED USETMAXREG MUFU.EX2 -- HMMA LDGSTS) ;;  # TMA in, lse/delta bulk copies, dQ bulk reduce-add
    *) return 1 ;;
  esac
}
"$FLASHTUNE" families --json >"$tmp/families.json" || { echo "FAIL: flashtune families"; exit 1; }
# name and hopper_only of every family that is not test-only
python3 -c 'import json, sys
for f in json.load(open(sys.argv[1])):
    if not f["test_only"]: print(f["name"], int(f["hopper_only"]))' "$tmp/families.json" >"$tmp/list.txt" || fail=1
[[ -s $tmp/list.txt ]] || { echo "FAIL: no families listed"; fail=1; }
while read -r family hopper_only; do
  if ! expect "$family"; then
    echo "FAIL: sass_check has no expectation for family $family: add one to expect() in tests/sass_check.sh"
    fail=1; continue
  fi
  archs=(sm_80 sm_90)
  [[ $hopper_only -eq 1 ]] && archs=(sm_90)
  for arch in "${archs[@]}"; do
    check "$family" "{\"family\":\"$family\",$space}" "$arch" "${ops[@]}"
  done
done <"$tmp/list.txt"
# fa3_wgmma's MULTICAST: K and V by multicast copies, the cluster barrier at entry and exit, slot releases
# on the other CTA's mbarriers (remote arrivals), and no spill (the producer's 32 registers hold the copies).
check fa3_wgmma_multicast '{"family":"fa3_wgmma","params":{"BLOCK_N":[128],"CONSUMERS":[2],"STAGES":[2],"OVERLAP":[1],"PINGPONG":[1],"P_SMEM":[0],"MULTICAST":[1]},"head_dims":[128],"causal":[false],"dtypes":["bf16"]}' \
  sm_90 HGMMA UTMALDG.4D.MULTICAST UCGABAR_ARV UCGABAR_WAIT SYNCS.ARRIVE.TRANS64.RED UTMASTG -- STL LDL
# fa3_wgmma_bwd's 80-row tile: dQ computed transposed (dQ^T = K^T dS^T: the scores' and dQ^T's wgmma N is 80),
# added by the bulk reduce, nothing spilled.
check fa3_wgmma_bwd_dqt '{"family":"fa3_wgmma_bwd","params":{"BLOCK_M":[80],"CONSUMERS":[2],"STAGES":[2],"SCHED":[0],"DQ_OVERLAP":[0],"DQ_TURNS":[1]},"head_dims":[128],"causal":[false],"dtypes":["bf16"]}' \
  sm_90 HGMMA.64x80x16 HGMMA.64x128x16 UTMALDG UBLKRED -- STL LDL
# The wgmma descriptors of fa3_wgmma's consumers in uniform registers: the warpgroup index broadcast from lane 0 and
# each k slice's descriptor the first one advanced (43 R2UR in this kernel when they were rebuilt per slice from a
# per-thread address; Nsight Compute counted 16 per main-loop step, FA3-class none). At most 8.
check_at_most() {  # check_at_most <name> <space json> <arch> <op> <max>
  local name=$1 space=$2 arch=$3 op=$4 max=$5
  compile "$name" "$space" "$arch" || return
  local cubins=("$tmp/$name"/*.cubin)
  [[ ${#cubins[@]} -gt 0 ]] || { echo "FAIL: $name: nothing compiled"; fail=1; return; }
  local count
  count=$("$CUOBJDUMP" -sass "${cubins[0]}" | grep -c "\b$op")
  if ((count > max)); then echo "FAIL: $name $arch: $count x $op (at most $max)"; fail=1; else echo "$name $arch: $count x $op"; fi
}
check_at_most fa3_wgmma_uniform_desc '{"family":"fa3_wgmma","params":{"BLOCK_N":[128],"CONSUMERS":[2],"STAGES":[2],"OVERLAP":[1],"PINGPONG":[0],"P_SMEM":[0]},"head_dims":[128],"causal":[true],"dtypes":["bf16"]}' \
  sm_90 R2UR 8
[[ $fail -eq 0 ]] && echo "sass_check: all passed"
exit $fail
