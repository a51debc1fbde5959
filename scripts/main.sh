#!/usr/bin/env bash
# The main job: tune what matters on GPU 0 into reports/<gpu>/results.db, then the headers, a summary
# table and the report.
#   Hopper (sm_90): bf16 forward (fa3_wgmma's main space), bf16 backward (fa2_mma_bwd at d 64,
#   fa2_wgmma_bwd's grid space at d 128/256) and fp32 forward (fa2_simt) on the standard grid, each by
#   successive halving within its share of MAIN_BUDGET (default 14m). A step's share is split over its
#   problems as they start (tune --time-budget), so every problem gets a pick; what a step leaves goes
#   to the later ones.
# An interrupted job continues: MAIN_STOP_S ends this run cleanly after that many seconds (each step's
# --time-budget shortened to fit; everything stored stays), and a rerun with MAIN_SPENT_S = the seconds
# the interrupted run spent continues it within what is left of MAIN_BUDGET, reusing what is stored.
# Progress: tune's lines (the step's ETA, never past its share) get the job's ETA appended: the time so
# far, what the step still needs, and the later steps' shares (halving on the full grid needs more than
# a share of the default budget, so a later step is expected to spend its share).
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
spent=${MAIN_SPENT_S:-0}
stop=${MAIN_STOP_S:-0}
[[ $spent =~ ^[0-9]+$ && $stop =~ ^[0-9]+$ ]] || { echo "main: MAIN_SPENT_S and MAIN_STOP_S must be whole seconds" >&2; exit 2; }
start=$(($(date +%s) - spent))  # the job's start: an interrupted run's seconds count
duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
seconds_of() {  # tune's "1h02m", "2m08s" or "45s" -> seconds
  local t=$1 s=0
  [[ $t =~ ([0-9]+)h ]] && s=$((s + 3600 * 10#${BASH_REMATCH[1]}))
  [[ $t =~ ([0-9]+)m ]] && s=$((s + 60 * 10#${BASH_REMATCH[1]}))
  [[ $t =~ ([0-9]+)s ]] && s=$((s + 10#${BASH_REMATCH[1]}))
  echo $s
}
# tune's stderr, with the job's ETA after each progress line: now + the step's own ETA + the later shares.
with_job_eta() {
  local line now
  while IFS= read -r line; do
    if [[ $line =~ ^tune\ .*\ eta\ ([0-9hms]+)\  ]]; then
      now=$(($(date +%s) - start))
      line="$line  | job $(duration $now), eta $(duration $((now + $(seconds_of "${BASH_REMATCH[1]}") + $1)))"
    fi
    printf '%s\n' "$line"
  done
}

# step <share of the budget, percent> <space> <problems> [strategy]
steps=()
if [[ "$($ft devices | grep -o 'sm_[0-9]*' | head -1)" == sm_90 ]]; then
  steps=("25 fa3_wgmma_main anchors_bf16" "25 fa3_wgmma_bwd_main anchors_bwd_bf16" "12 fa2_wgmma_bwd_grid anchors_bwd_bf16_d256"
         "13 decode_splitkv decode_bf16" "25 fa2_simt anchors_fp32")
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
  if [[ $stop -gt 0 ]]; then
    run_left=$((stop - ($(date +%s) - start - spent)))
    if [[ $run_left -lt 30 ]]; then
      echo "main: stopped after $((elapsed - spent))s of this run (MAIN_STOP_S); continue with" \
        "MAIN_SPENT_S=$elapsed and the same MAIN_BUDGET" >&2
      exit 3
    fi
    [[ $give -gt $run_left ]] && give=$run_left
  fi
  later=$((left - give))  # the later steps' shares (and what a stop left of this one's)
  echo "main: [$i/$n] $space on $problems (${strategy:-halving}, up to ${give}s; elapsed ${elapsed}s of ${budget_s}s," \
    "job eta $(duration $((elapsed + give + later)))" >&2
  $ft tune "configs/spaces/$space.json" "configs/problems/$problems.json" --db "$db" \
    --strategy "${strategy:-halving}" --time-budget "${give}s" 2> >(with_job_eta "$later" >&2)
done
wait  # the last progress filter
elapsed=$(($(date +%s) - start))
if [[ $stop -gt 0 && $((elapsed - spent)) -ge $stop ]]; then
  echo "main: stopped after $((elapsed - spent))s of this run (MAIN_STOP_S); continue with MAIN_SPENT_S=$elapsed" \
    "and the same MAIN_BUDGET" >&2
  exit 3
fi
echo "main: tuning done in $(duration $elapsed)" >&2
$ft emit --db "$db" --out configs/generated
$ft best --db "$db" | tee "$out/summary.txt"
$ft report --db "$db" --out "$out" >/dev/null || echo "main: the report could not be drawn (see above)" >&2
echo "main: $(($(date +%s) - start))s; results in $db, headers in configs/generated/, summary in $out/summary.txt"
