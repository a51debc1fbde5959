#!/usr/bin/env bash
# The main job: tune what matters on GPU 0 into reports/<gpu>/results.db, then the headers, a summary
# table and the report.
#   Hopper (sm_90): bf16 forward (fa2_mma), bf16 backward (fa2_mma_bwd at d 64, fa2_wgmma_bwd's grid space
#   at d 128/256) and fp32 forward (fa2_simt) on the standard grid, each by successive halving within
#   its share of MAIN_BUDGET (default 14m; a share that runs out ends that step with what it stored).
#   Other GPUs: fa2_simt and naive on the fp32 grid, exhaustively.
# Without a GPU: compile and prune the fp32 space for sm_90, print the resource table, say so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# MAIN_SKIP_SETUP=1: the build exists already (a machine without network, where setup cannot install).
[[ "${MAIN_SKIP_SETUP:-0}" == 1 ]] || source scripts/setup.sh
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
budget_s=$(python3 -c "import sys; s=sys.argv[1]; u={'h':3600,'m':60,'s':1}.get(s[-1]); print(int(float(s[:-1])*u if u else float(s)))" "${MAIN_BUDGET:-14m}")
start=$(date +%s)

# step <share of the budget, percent> <space> <problems> [strategy]
steps=()
if [[ "$($ft devices | grep -o 'sm_[0-9]*' | head -1)" == sm_90 ]]; then
  steps=("30 fa2_mma anchors_bf16" "15 fa2_mma_bwd anchors_bwd_bf16_d64" "25 fa2_wgmma_bwd_grid anchors_bwd_bf16_d128_256"
         "30 fa2_simt anchors_fp32")
else
  steps=("80 fa2_simt anchors_fp32 exhaustive" "20 naive anchors_fp32 exhaustive")
fi
n=${#steps[@]}
i=0
for step in "${steps[@]}"; do
  read -r share space problems strategy <<<"$step"
  i=$((i + 1))
  elapsed=$(($(date +%s) - start))
  left=$((budget_s - elapsed))
  # This step's share of what is left, so that what an earlier step did not spend goes to the later ones.
  rest=$share
  for later in "${steps[@]:$i}"; do rest=$((rest + ${later%% *})); done
  give=$((left * share / rest))
  if [[ $give -lt 30 ]]; then
    echo "main: [$i/$n] $space skipped: the budget is spent" >&2
    continue
  fi
  echo "main: [$i/$n] $space on $problems (${strategy:-halving}, up to ${give}s; elapsed ${elapsed}s of ${budget_s}s)" >&2
  $ft tune "configs/spaces/$space.json" "configs/problems/$problems.json" --db "$db" \
    --strategy "${strategy:-halving}" --time-budget "${give}s"
done
$ft emit --db "$db" --out configs/generated
$ft best --db "$db" | tee "$out/summary.txt"
$ft report --db "$db" --out "$out" >/dev/null || echo "main: the report could not be drawn (see above)" >&2
echo "main: $(($(date +%s) - start))s; results in $db, headers in configs/generated/, summary in $out/summary.txt"
