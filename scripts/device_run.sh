#!/usr/bin/env bash
# One call on the lent GPU machine: build, then one stage, results under $OUT.
#   tests  - the `gpu` CTest label (fault isolation, every variant validated on ragged shapes, scaled and
#            heavy-tailed inputs, slightly wrong kernels refused)
#   edges  - issue 12's reported cases (Sk = 1 backward, x30 / x5 / heavy-tailed inputs) through `run --json`;
#            concurrent writers on one store and a kill -9 resume (gpu_concurrent_tune)
#   library - the runtime, the CMake consumer and the torch op (gpu tests), pip install, train_tiny_gpt
#   search - the search path of tune on the GPU (gpu_search: halving on two workers of one GPU, resume,
#            guided, early stop, a crash on one worker), fault isolation, concurrent writers
#   main-job - scripts/main.sh from this fresh build, cold caches, within MAIN_BUDGET
#   aot    - a second build with FLASHTUNE_AOT_ARCHS="80;90a": gpu_runtime with every kernel from the library
#   exhaustive-check - the main job's Hopper spaces exhaustively on its problems; its picks (the carried store)
#            timed within them (halving_vs_exhaustive_<family>.csv; EX_STEPS picks the steps)
#   ab-picks FAMILY... - where a pick and the exhaustive best differ, the two timed alternately (ab_picks_<family>.csv)
#   multi-gpu [one|two|four|all] - issues 17 and 33: one sweep on --devices 1, then on --devices 0,1 with a crash on
#            one worker, and (four, on a machine with four GPUs) on --devices 0,1,2,3; multi_gpu_sweep.csv
#            (experiments/multi_gpu_sweep.py); each sweep's log (the workers' prepare and run times) as <part>.log
#   fa3-short - fa3_wgmma's TWO_CTAS (two CTAs per SM): every compiled fa3_wgmma_2cta.json variant validated on
#            ragged shapes (fa3_validate.db), fa3_wgmma_short.json tuned by halving on the four points still below
#            cuDNN (anchors_fa3_missed.json), each point's best re-timed beside torch flash and cuDNN in one run
#            (fwd_short_vs_peers.csv); ~4 min, at most ~8.5 (FA3_SHORT_*_LIMIT_S)
#   gqa-peers - fa3_wgmma and fa2_wgmma_bwd tuned on the GQA grid, re-timed beside torch SDPA in one run (gqa_vs_peers.csv)
#   gqa    - issue 16's grouped-query attention: every fa2_mma(_bwd) variant validated on ragged GQA/MQA shapes,
#            both tuned on Llama-3-like shapes beside torch SDPA (enable_gqa): gqa_vs_peers.csv;
#            gqa wgmma-check | wgmma-time: fa2_wgmma_bwd's GQA (validated; tuned and timed: gqa_bwd_vs_peers.csv)
#   varlen [check] [fwd] [bwd] [check-fa3] [fwd-fa3] [check-wgmma-bwd] [bwd-wgmma] [peers] - issue 16's
#            packed variable-length batches: every compiled fa2_mma, fa2_mma_bwd (check), fa3_wgmma (check-fa3) and
#            fa2_wgmma_bwd (check-wgmma-bwd) variant in its varlen form validated on ragged packed batches, tuned by
#            halving on Llama-style 16k-token batches (fwd, bwd, fwd-fa3, bwd-wgmma), then the
#            picks re-timed beside torch's flash varlen path and cuDNN on the same batches in one run (peers):
#            varlen_vs_peers.csv
#   decode - decode_splitkv: every compiled variant validated on ragged decoding shapes, tuned (halving) on the
#            Llama-3 8B decoding grid, re-timed beside torch SDPA (each backend, enable_gqa) and a device copy of
#            the same bytes in one run: decode_vs_peers.csv
#   decode-paged [check] [tune] [peers] [check-nhd] [tune-nhd] - issue 16's paged K/V cache: every compiled
#            decode_splitkv variant in its paged form validated on ragged paged caches (decode_paged_validate.db),
#            tuned (halving) on the decoding grid from 256-key pages, each point's paged pick timed beside the dense
#            pick in one run: decode_paged_vs_dense.csv; issue 31's token-major pools (FlashAttention's/vLLM's
#            [num_pages, page_size, Hk, d]) validated (check-nhd: decode_paged_nhd_validate.db) and tuned
#            (tune-nhd: decode_paged_nhd.db, apart from results.db) only when named
#   autotune-first-use - issue 36: tuning at first use with the committed tables off (FLASHTUNE_TABLES=off: an
#            untabled GPU), then a second process that must not tune times the stored picks beside the committed
#            table's, forward and backward, profiler kernel time (experiments/autotune_first_use.py):
#            autotune_first_use.csv; AUTOTUNE_GPUS parts side by side on as many GPUs, AUTOTUNE_OFFSET/SUBSET a part
#            of the 18 buckets, AUTOTUNE_BUDGET_S per bucket, AUTOTUNE_CALL_S the call's wall time
#   fa2-det-sched - fa2_wgmma_bwd's SCHED 1/3 validated on ragged shapes, then tuned deterministic on the d 256
#            grid points beside SCHED 0: fa2_det_sched.db (and fa3_wgmma_bwd's SCHED 3 on part-empty groups)
#   host-time [B,H,S,d ...] - where the torch op's host time goes (experiments/probes/host_time.py): host_time.csv
#   torch-op [PART ...] - the runtime and the PyTorch extension alone (their targets), python_unit, gpu_torch_op's
#            PARTs (default: all), each probe shape's kernels compiled meanwhile in the background, then the host-time
#            probe: host_time.csv and host_time.txt
#   mods   - issue 32: ALiBi variants of the Hopper mods spaces validated on ragged shapes (alibi_validate.db),
#            ALiBi's cost at one long point forward and backward
#   mods-mma - issue 32 on fa2_mma and fa2_mma_bwd (sm_80's forward and backward, any GPU): every compiled variant
#            of fa2_mma_mods validated on the ragged window, softcap and ALiBi problems, dense and packed, and of
#            fa2_mma_bwd_mods on the backward's (both dQ modes) (mma_mods_validate.db)
#   mask-configs - issue 32: the mask spaces' configs timed on the document masks of variants_peers.py (mask_docs.db)
#   space-configs NAME PROBLEMS SPACE.. - the spaces' configs timed exhaustively on PROBLEMS (NAME.db, NAME.txt)
#   variants-peers - issue 32: experiments/variants_peers.py (windows, softcap, ALiBi through the op beside the plain
#            call, FlexAttention and FA4's sm90 kernel if installed; VARIANTS_DIMS and VARIANTS_SEQS the head dims
#            and sequences, VARIANTS_ARGS its other options, VARIANTS_LIMIT_S the time limit, default 480; the
#            compiles first in parallel warm processes, VARIANTS_WARM_LIMIT_S, default 300): variants_vs_peers.csv,
#            variants_peers.log
#   train [PROFILE_STEPS] - examples/train_tiny_gpt.py through the extension, at its default size and at context 2048
#            (8 heads of 64, batch 8), the two runs' steps interleaved; each then profiled PROFILE_STEPS (default 10)
#            steps: train_tiny_gpt{,_ctx2048}{.csv,.png,_profile.csv}, train.log
#   overhead - experiments/module_overhead.py (op vs the same kernels through the harness, SDPA beside)
#   full-compile - the `nvrtc_full` label (every variant of every space compiled for sm_80 and sm_90)
#   final  - tests, stored best configs re-timed, the closest call against torch flash re-measured
#   sweep-simt - tune fa2_simt and naive on the fp32 standard grid, torch SDPA baseline in the same run
#   sweep-mma  - tune fa2_mma on the bf16 18-point grid
#   compare-mma - re-time the tuned best, FA2's fixed table, torch flash and cuDNN side by side; tolerance probe
#   sweep-bwd  - tune fa2_simt_bwd on the fp32 grid beside torch SDPA efficient's backward
#   sweep-mma-bwd - tune fa2_mma_bwd on the bf16 grid; compare-mma-bwd - re-timed beside torch flash and cuDNN
#   check-wgmma [all] - a few fa2_wgmma_bwd configs validated on ragged shapes and timed at S = 4k
#   exp-wgmma BM,BN,SPLIT,STAGES,DQ_RED[,LOAD]:d ... - those fa2_wgmma_bwd configs validated on ragged shapes, timed on the grid
#   error-wgmma - the tuned configs' error vs torch flash on identical inputs (d 128/256)
#   refresh-wgmma-d256 - error vs torch flash on identical inputs (d 128/256); DQ_RED 2 stored and compared at d = 256
#   profile-wgmma BM,BN,SPLIT,STAGES,DQ_RED[,LOAD] B,H,Sq,Sk,d - Nsight Compute sections of the fa2_wgmma_bwd dK/dV kernel
#   sweep-wgmma-bwd - tune fa2_wgmma_bwd on the grid's d 128/256 points; the best of both bf16 backward
#                 families per point re-timed beside torch flash and cuDNN (bwd_vs_sdpa.csv)
#   experiments NAME... - `flashtune experiment experiments/NAME.json` for each, then the report rebuilt
#   smoke-baselines - the Python baselines (torch SDPA backends, CPU, Triton) on tiny problems
#   every sweep: comparison CSVs and generated headers; the DB without cubins comes back in a tarball
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stage=${1:?stage: tests, final, experiments, smoke-baselines, sweep-simt, sweep-bwd, sweep-mma, compare-mma, sweep-mma-bwd, compare-mma-bwd, check-wgmma, sweep-wgmma-bwd, varlen, ...}
shift
log() { echo "== $(date +%T) $*"; }
# with_peers CMD...: CMD in the peer scripts' environment: the package, this build's library and the FA3-class
# peer (FA4's sm90) where .fa4a/.fa4b installed it.
with_peers() {
  local lib fa4
  lib=$(ls build/runtime/libflashtune_attention.so* | head -1)
  fa4=$(cat /tmp/fa4/pythonpath 2>/dev/null || true)
  PYTHONPATH="$PWD/python${fa4:+:$fa4}${PYTHONPATH:+:$PYTHONPATH}" FLASHTUNE_LIBRARY="$PWD/$lib" "$@"
}
# Nsight Compute on one kernel of a command (clocks as they are), its report kept under $OUT as NAME.ncu-rep with
# the details page (NAME.txt) and the SASS source page (NAME.sass.csv.gz, for experiments/probes/sass_mix.py); the
# headline metrics printed. ncu_profile NAME KERNEL_REGEX COMMAND...
ncu_profile() {
  local name=$1 regex=$2
  shift 2
  ncu --clock-control none -k "regex:$regex" -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section InstructionStats --section SourceCounters --import-source no -o "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/$name.txt" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/$name.sass.csv" 2>&1
  gzip -f "$OUT/$name.sass.csv"
  echo "== $name"
  grep -E "Duration|Registers Per|Executed Ipc A|Issue Slots Busy|No Eligible|Tensor|L2 Hit" "$OUT/$name.txt" | head -12
}
# Nsight Compute at each POINTS entry "params;B,H,Sq,Sk,d;causal" (entries split by '|'): our kernel (fa3_wgmma's
# forward or fa3_wgmma_bwd's dK/dV kernel, run by `run` with the params; PROFILE_OURS=0 skips it), the FA3-class
# kernel's (FA4's sm90, where .fa4a/.fa4b installed it) and torch's cuDNN kernel at the same shape, as NAME_<i>_ours,
# _fa4 and _cudnn. profile_points fwd|bwd NAME POINTS
profile_points() {
  local dir=$1 name=$2 points=$3 fa4path family kernel peer cudnn pt i=0
  fa4path=$(cat /tmp/fa4/pythonpath 2>/dev/null || true)
  if [[ $dir == fwd ]]; then family=fa3_wgmma kernel=fa3_wgmma_fwd peer='ForwardSm90|fwd_sm90' cudnn=sdpa_sm90_flash_fprop
  else family=fa3_wgmma_bwd kernel=fa3_wgmma_bwd_dkdv peer='BackwardSm90|bwd_sm90' cudnn=sdpa_sm90_flash_bprop; fi
  IFS='|' read -ra plist <<<"$points"
  for pt in "${plist[@]}"; do
    IFS=';' read -r prof_params prof_shape prof_causal <<<"$pt"
    c=""; [[ $prof_causal == 1 ]] && c="--causal"
    [[ ${PROFILE_OURS:-1} == 1 ]] && ncu_profile "${name}_${i}_ours" "$kernel" \
      $ft run --family "$family" --params "$prof_params" --shape "$prof_shape" --dtype bf16 $c --direction "$dir"
    if [[ -n $fa4path ]]; then
      PYTHONPATH="$fa4path${PYTHONPATH:+:$PYTHONPATH}" ncu_profile "${name}_${i}_fa4" "$peer" \
        python3 experiments/probes/peer_once.py fa4 "$dir" "$prof_shape" "$prof_causal"
    else
      echo "profile: FA3-class peer not installed, skipped"
    fi
    ncu_profile "${name}_${i}_cudnn" "$cudnn" python3 experiments/probes/peer_once.py cudnn "$dir" "$prof_shape" "$prof_causal"
    i=$((i + 1))
  done
}
# The device tool brings back at most 8 files from $OUT: past 7, everything goes into one out.tgz, also when a
# time limit stops the script (TERM).
pack_out() {
  local n
  n=$(find "$OUT" -mindepth 1 -maxdepth 1 | wc -l)
  ((n > 7)) || return 0
  tar czf "/tmp/device_run_out.$$.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "/tmp/device_run_out.$$.tgz" "$OUT/out.tgz"
}
trap pack_out EXIT
trap 'exit 143' TERM

log build
extra=()
# The device image has libsqlite3.so.0 but not its header: a carried copy of the header (.devdeps,
# never committed) stands in for the -dev package there.
if [[ ! -f /usr/include/sqlite3.h && -f .devdeps/include/sqlite3.h ]]; then
  extra=(-DSQLite3_INCLUDE_DIR=$PWD/.devdeps/include -DSQLite3_LIBRARY=/usr/lib/x86_64-linux-gnu/libsqlite3.so.0)
fi
# The main job needs the CLI and its worker only (what a user's first build of the main job makes).
targets=()
[[ $stage == main-job ]] && targets=(--target flashtune flashtune-worker)
[[ $stage == torch-op || $stage == train || $stage == host-time || $stage == autotune-first-use || $stage == decode-op ]] && targets=(--target flashtune flashtune-worker flashtune_attention flashtune_torch abi_layout make_fixture_db lookup_probe)
build_t0=$(date +%s)
if ! { cmake --preset release -DFLASHTUNE_BENCHMARKS=OFF "${extra[@]}" && cmake --build build -j"$(nproc)" "${targets[@]}"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
log "built in $(($(date +%s) - build_t0)) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
ft=build/flashtune
$ft devices || exit 1
slug=$($ft devices --slug)

rep=reports/$slug
db=$rep/results.db
mkdir -p "$rep"
tune() {  # tune <space> <problems>; stopped in time to pack what is stored (a rerun resumes)
  log "tune $1 on $2"
  timeout "${TUNE_LIMIT_S:-450}" $ft tune "configs/spaces/$1.json" "configs/problems/$2.json" --db "$db" 2>&1 | tail -4
}
# Baseline rows and the comparison CSV for one family: compare <family> <problems> <backend> <out name>
compare() {
  log "torch sdpa $3 on $2"
  python3 experiments/sdpa_baseline.py "configs/problems/$2.json" --backend "$3" --out "$rep/sdpa_$3_$2.csv" 2>&1 | tail -8
  $ft best --db "$db" --family "$1" --csv >"$rep/best_$1.csv"
  python3 experiments/compare.py "$rep/best_$1.csv" "$rep/sdpa_$3_$2.csv" --out "$rep/$4"
}
# "BM,BN,SPLIT,STAGES,DQ_RED[,LOAD]" -> fa2_wgmma_bwd's --params string (LOAD defaults to 0)
wgmma_params() {
  local bm bn sp st red load
  IFS=, read -r bm bn sp st red load <<<"$1"
  echo "BLOCK_M=$bm,BLOCK_N=$bn,SPLIT=$sp,STAGES=$st,DQ_RED=$red,LOAD=${load:-0}"
}
# Identical-input error vs torch flash of the tuned fa2_wgmma_bwd (d 128, 256; --best from the DB)
wgmma_error() {
  python3 experiments/bwd_error_vs_torch.py --family fa2_wgmma_bwd --dims 128,256 --db "$db" --time-limit-s "${ERROR_LIMIT_S:-150}" \
    --out "$rep/bwd_error_vs_torch_wgmma.csv" >"$OUT/error.log" 2>&1; tail -3 "$OUT/error.log"
}
# One fa2_wgmma_bwd config (params) validated at head dim d on three ragged shapes: wgmma_ragged_checks <params> <d>
wgmma_ragged_checks() {
  local shape
  for shape in "2,3,333,517,$2 bf16" "1,2,517,333,$2 fp16 --causal" "2,2,256,256,$2 bf16 --causal"; do
    set -- "$1" $shape
    $ft run --family fa2_wgmma_bwd --params "$1" --shape "$2" --dtype "$3" ${4:-} --direction bwd --check 2>&1 |
      grep -E "status|error|dq|fa2_" | tr '\n' ' '; echo " <- $1 $shape"
  done
}
# A validation store's rows by family and status, the first rows that are not ok; exit 1 if any compiled
# variant failed (pruned variants are not run): validation_summary <db>
validation_summary() {
  python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for fam, st, n in c.execute("select family, status, count(*) from results group by family, status"):
    print(f"validation {fam}: {n} {st}")
bad = list(c.execute("select family, config, batch, heads, heads_k, seq_q, seq_k, head_dim, dtype, causal, status, "
                     "substr(error,1,200) from results where status not in ('ok', 'pruned')"))
for r in bad[:8]:
    print("  not ok:", r)
sys.exit(1 if bad else 0)
PY
}
# Headers from everything stored, the DB without binaries, and all of it back under $OUT.
# A validation store (reports/<gpu>/NAME_validate.db): committed gzipped (.gitignore), unpacked here when a
# stage adds to it; finish packs every one back, so sweep.tar.gz brings the .gz to commit.
validation_store() {
  local v=$rep/$1_validate.db
  [[ -f $v || ! -f $v.gz ]] || gunzip -k "$v.gz"
  echo "$v"
}
finish() {
  if [[ -f $db ]]; then  # (a call that carries the FA3-class peer leaves the store behind: 64 MiB a call)
    $ft emit --db "$db" --out configs/generated
    $ft drop-cubins --db "$db"
  fi
  for v in "$rep"/*_validate.db; do [[ -f $v ]] && gzip -9 -n -f -k "$v"; done
  tar czf "$OUT/sweep.tar.gz" "$rep" configs/generated
}

# Issue 12's reported cases, each with a tuned or default config of its family (Sk = 1 backward, x30, x5 and heavy-tailed inputs).
edge_cases() {
  log "edge cases"
  while read -r fam params shape dt extra; do
    $ft run --family "$fam" --params "$params" --shape "$shape" --dtype "$dt" $extra --json >"$OUT/edge.json" 2>&1
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['status'], j['family'], sys.argv[2], sys.argv[3], 'worst/bound', j['detail'].get('worst_err_over_bound'), 'max_abs', j['max_abs'], j.get('error','')[:120])" \
      "$OUT/edge.json" "$shape" "$dt $extra" || cat "$OUT/edge.json"
  done <<'CASES'
fa2_simt_bwd BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,DQ_MODE=1 1,1,1,1,64 fp32 --direction=bwd
fa2_simt_bwd BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,DQ_MODE=1 1,1,4096,1,64 fp32 --direction=bwd --causal
fa2_mma_bwd BLOCK_M=32,BLOCK_N=64,WARPS=8,DSPLIT=2,STAGES=2,DQ_MODE=1 1,1,4096,1,64 fp16 --direction=bwd --causal
fa2_wgmma_bwd BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1 1,1,4096,1,64 fp16 --direction=bwd --causal
fa2_wgmma_bwd BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1 1,1,1,1,64 fp16 --direction=bwd
fa2_mma BLOCK_M=128,BLOCK_N=64,WARPS=4,STAGES=2 2,4,2048,2048,64 bf16 --input-scale=30 --check
fa2_mma BLOCK_M=128,BLOCK_N=128,WARPS=8,STAGES=2 2,4,1024,1024,128 bf16 --input-scale=30 --check
fa2_simt BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2 2,4,1024,1024,64 fp32 --input-scale=30 --check
fa2_simt_bwd BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,DQ_MODE=1 1,2,1024,1024,64 fp32 --direction=bwd --input-scale=5
fa2_mma_bwd BLOCK_M=32,BLOCK_N=64,WARPS=8,DSPLIT=2,STAGES=2,DQ_MODE=1 1,2,1024,1024,128 bf16 --direction=bwd --input-scale=30
fa2_wgmma_bwd BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1 1,2,1024,1024,128 bf16 --direction=bwd --input-dist=heavy --input-scale=3
CASES
}
case $stage in
experiments)
  logs=$(mktemp -d)
  for name in "$@"; do
    log "experiment $name"
    timeout "${EXPERIMENT_LIMIT_S:-500}" $ft experiment "experiments/$name.json" --db "$db" --quiet 2>"$logs/$name.log"
    echo "exit $?"; grep -E "^(probes|experiment)" "$logs/$name.log" | tail -3
  done
  $ft report --gpu "$slug" >/dev/null 2>"$logs/report.log" || tail -5 "$logs/report.log"
  tar czf "$OUT/logs.tar.gz" -C "$logs" .
  finish
  ;;
smoke-baselines)
  bash experiments/smoke_baselines.sh 2>&1 | tail -60
  ;;
tests)
  log "ctest gpu"
  VALIDATE_DB=$OUT/validate.db ctest --preset gpu -V >"$OUT/ctest_gpu.log" 2>&1
  grep -E "Test +#|tests passed|FAIL|BAD|^[0-9]+: (naive|fa1_|fa2_|fault|cublas|torch|triton) " "$OUT/ctest_gpu.log" | tail -60
  edge_cases | tee "$OUT/edge_cases.txt"
  ;;
edges)
  edge_cases | tee "$OUT/edge_cases.txt"
  ctest --test-dir build -R gpu_concurrent_tune -V 2>&1 | grep -vE "^[0-9]+: *$" | tail -30
  ;;
library)
  # The runtime library, the installed CMake package's consumer and the PyTorch op on this GPU; the
  # package pip-installed offline (scikit-build-core from the carried .whl/); the training example.
  log "ctest runtime, cmake consumer, torch op"
  ctest --test-dir build -R 'gpu_runtime|gpu_cmake_consumer|gpu_torch_op|python_unit' -V >"$OUT/ctest_library.log" 2>&1
  grep -E "Test +#|tests passed|FAIL|explain|error|ratio" "$OUT/ctest_library.log" | tail -60
  log "pip install"
  python3 -m pip install -q --no-index --find-links .whl scikit-build-core 2>&1 | tail -3
  CMAKE_ARGS="${extra[*]}" python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 ||
    tail -30 "$OUT/pip.log"
  (cd /tmp && python3 -c "import flashtune; print(flashtune.__file__, flashtune.device_available())")
  log "train_tiny_gpt"
  (cd /tmp && python3 "$OLDPWD/examples/train_tiny_gpt.py" --out-dir "$OLDPWD/$rep") 2>&1 | tail -15
  cp "$rep"/train_tiny_gpt.* "$OUT/" 2>/dev/null
  ;;
aot)
  # Ahead-of-time kernels: a build of its own (build-aot) embedding every kernel the runtime picks on
  # sm_80 and sm_90; gpu_runtime's pass 0 runs every case from them and checks that nothing was compiled.
  log "AOT build (80;90a)"
  if ! { cmake -S . -B build-aot -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHTUNE_BENCHMARKS=OFF \
           "-DFLASHTUNE_AOT_ARCHS=80;90a" "${extra[@]}" &&
         cmake --build build-aot --target gpu_runtime_test -j"$(nproc)"; } >"$OUT/build_aot.log" 2>&1; then
    tail -40 "$OUT/build_aot.log"; exit 1
  fi
  grep -E "flashtune AOT|not built|pruned|compile_error" "$OUT/build_aot.log" | tail -20
  ctest --test-dir build-aot -R '^gpu_runtime$' -V >"$OUT/ctest_aot.log" 2>&1
  grep -E "aot|tests passed|FAIL" "$OUT/ctest_aot.log" | tail -40
  ;;
overhead)
  log "module overhead"
  PYTHONUNBUFFERED=1 timeout "${OVERHEAD_LIMIT_S:-540}" python3 experiments/module_overhead.py --flashtune "$ft" 2>&1 | tail -30
  cp "$rep/module_overhead.csv" "$OUT/" 2>/dev/null
  ;;
search)
  log "ctest gpu_search, gpu_fault_isolation, gpu_concurrent_tune"
  ctest --test-dir build -R 'gpu_search|gpu_fault_isolation|gpu_concurrent_tune' -V 2>&1 | grep -vE "^[0-9]+: *$" | tail -40
  ;;
main-job)
  # The main job from this fresh build with cold caches (no store, no compile cache), within MAIN_BUDGET.
  # MAIN_RESUME=1: keep the carried store (the job continued after a call's time limit);
  # MAIN_TIMEOUT_S: stop the job there (the store keeps every finished evaluation).
  # A job longer than a call: MAIN_STOP_S ends this call's run cleanly, and the next call (MAIN_RESUME=1,
  # MAIN_SPENT_S from the first's last line, the store and main_job.log carried back) continues it.
  mlog=$rep/main_job.log
  [[ "${MAIN_RESUME:-0}" == 1 ]] || rm -f "$db" "$db-wal" "$db-shm" "$mlog"
  log "main job (MAIN_BUDGET=${MAIN_BUDGET:-14m}, resume ${MAIN_RESUME:-0}, spent ${MAIN_SPENT_S:-0}, stop ${MAIN_STOP_S:-0})"
  t0=$(date +%s)
  MAIN_SKIP_SETUP=1 timeout "${MAIN_TIMEOUT_S:-3600}" bash scripts/main.sh >"$OUT/main.log" 2>&1
  echo "main job: exit $?, $(($(date +%s) - t0)) s"
  cat "$OUT/main.log" >>"$mlog"
  grep -E "^main:|evaluated|budget" "$OUT/main.log" | tail -60
  # The job's ETA shown at 10% of the tuning time against that time.
  python3 - "$mlog" <<'PY'
import re, sys
sec = lambda m, s: 60 * int(m) + int(s)
log = open(sys.argv[1]).read()
done = re.search(r"main: tuning done in (\d+)m(\d+)s", log)
etas = [(sec(*m[:2]), sec(*m[2:])) for m in re.findall(r"\| job (\d+)m(\d+)s, eta (\d+)m(\d+)s", log)]
if not done or not etas:
    sys.exit("main job: no ETA lines or no end")
total = sec(*done.groups())
at, eta = next(((t, e) for t, e in etas if t >= 0.1 * total), etas[-1])
print(f"main job: tuning took {total}s; at {at}s ({100 * at / total:.0f}%) the ETA shown was {eta}s: {eta / total:.3f}x")
PY
  cp "$rep/summary.txt" "$OUT/" 2>/dev/null
  finish
  ;;
exhaustive-check)
  # The main job's picks (the carried store, from `main-job`) timed inside exhaustive sweeps of the same
  # spaces on the same problems, each in a store of its own: halving_vs_exhaustive_<family>.csv.
  # EX_STEPS: which of the main job's Hopper steps ("space:problems:family", space-separated; two calls
  # fit them all); EX_LIMIT_S bounds each sweep (a rerun in the same call resumes).
  steps=${EX_STEPS:-"fa3_wgmma_main:anchors_bf16:fa3_wgmma fa2_mma_bwd:anchors_bwd_bf16_d64:fa2_mma_bwd fa2_wgmma_bwd_grid:anchors_bwd_bf16_d128_256:fa2_wgmma_bwd fa2_simt:anchors_fp32:fa2_simt"}
  for step in $steps; do
    IFS=: read -r space probs fam <<<"$step"
    ex=$rep/exhaustive_$fam.db
    log "exhaustive $space on $probs"
    timeout "${EX_LIMIT_S:-400}" $ft tune configs/spaces/$space.json configs/problems/$probs.json --db "$ex" --quiet \
      --stop-margin 0 >"$OUT/exhaustive_$fam.log" 2>&1
    echo "exit $?"; tail -3 "$OUT/exhaustive_$fam.log"
    python3 experiments/halving_vs_exhaustive.py "$db" "$ex" "$fam" "$rep/halving_vs_exhaustive_$fam.csv" | tail -20
    $ft drop-cubins --db "$ex"
  done
  tar czf "$OUT/sweep.tar.gz" "$rep"
  ;;
ab-picks)
  # ab-picks FAMILY...: where the main job's pick and the exhaustive best differ (the carried
  # halving_vs_exhaustive_<family>.csv), the two timed alternately in this run (ab_picks_<family>.csv).
  for fam in "$@"; do
    log "pick against exhaustive best, interleaved: $fam"
    python3 experiments/ab_picks.py $ft "$rep/halving_vs_exhaustive_$fam.csv" "$fam" "$rep/ab_picks_$fam.csv" \
      --min-ratio "${AB_MIN_RATIO:-1.0}" 2>&1 | tail -12
  done
  tar czf "$OUT/sweep.tar.gz" "$rep"
  ;;
multi-gpu)
  # Issues 17 and 33: one sweep over two (four) GPUs against one GPU alone. "two": gpu_search, the sweep with
  # --devices 0,1, a crash injected on one worker; "one": the sweep with --devices 1; "four" (a machine with four
  # GPUs): the sweep with --devices 0,1,2,3; the analysis once one, two and the fault store are there, with four's
  # when it is (calls on one warm machine; a cold one gets .mg back carried). All start from the same compile
  # cache, so the wall times are the GPU work. Spaces and problems: MG_SWEEPS.
  part=${1:-all}
  mg=.mg; mkdir -p $mg
  sweeps=${MG_SWEEPS:-"fa2_mma:anchors_bf16 fa2_mma_bwd:anchors_bwd_bf16_d64"}
  if [[ ! -f $mg/cache.db ]]; then
    log "compile cache (no GPU visible: compile and prune only)"
    arch=$($ft devices | grep -o ' sm_[0-9a-z]*' | head -1 | tr -d ' ')
    for s in $sweeps; do
      CUDA_VISIBLE_DEVICES= $ft tune "configs/spaces/${s%%:*}.json" "configs/problems/${s##*:}.json" --db $mg/cache.db --arch "$arch" --quiet | tail -1
    done
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('delete from results'); c.commit()" $mg/cache.db
  fi
  sweep() {  # sweep <name> <devices>: every sweep into $mg/<name>.db, wall time and kernel runs into $mg/<name>.json
    cp $mg/cache.db $mg/$1.db
    : >$mg/$1.log
    local fwd=0 bwd=0 runs=0
    for s in $sweeps; do
      log "tune ${s%%:*} on ${s##*:}, --devices $2"
      t0=$(date +%s.%N)
      $ft tune "configs/spaces/${s%%:*}.json" "configs/problems/${s##*:}.json" --db $mg/$1.db --devices "$2" --quiet >$mg/$1.out 2>&1
      rc=$?; t1=$(date +%s.%N); grep '^device [0-9]*: [0-9]* prepares' $mg/$1.out; tail -1 $mg/$1.out
      cat $mg/$1.out >>$mg/$1.log
      [[ $rc == 0 ]] || { cat $mg/$1.out; exit 1; }
      n=$(tail -1 $mg/$1.out | python3 -c "import re,sys; print(sum(int(x) for x in re.findall(r'(\d+) (?:ok|invalid|crashed|timeout|error)', sys.stdin.read())))")
      runs=$((runs + n))
      if [[ $s == *bwd* ]]; then bwd=$(python3 -c "print($bwd + $t1 - $t0)"); else fwd=$(python3 -c "print($fwd + $t1 - $t0)"); fi
    done
    echo "{\"fwd\": $fwd, \"bwd\": $bwd, \"runs\": $runs}" >$mg/$1.json; cat $mg/$1.json
    cp $mg/$1.db $OUT/$1.db; $ft drop-cubins --db $OUT/$1.db; cp $mg/$1.json $mg/$1.log $OUT/
  }
  if [[ $part == two || $part == all ]]; then
    ctest --test-dir build -R gpu_search --output-on-failure 2>&1 | grep -E "passed|FAIL|Passed|Failed" | tail -4
    sweep two 0,1
    log "fault family on --devices 0,1"
    cat >$mg/f.json <<'JSON'
{"problems": [{"batch": 1, "heads": 2, "seq_q": 100, "seq_k": 130, "head_dim": 32},
              {"batch": 1, "heads": 2, "seq_q": 130, "seq_k": 100, "head_dim": 32, "causal": true},
              {"batch": 2, "heads": 2, "seq_q": 64, "seq_k": 200, "head_dim": 32},
              {"batch": 2, "heads": 2, "seq_q": 200, "seq_k": 64, "head_dim": 32, "causal": true}]}
JSON
    rm -f $mg/fault.db
    $ft tune configs/spaces/fault.json $mg/f.json --db $mg/fault.db --devices 0,1 --timeout 4 --quiet 2>&1 | tail -2
    $ft drop-cubins --db $mg/fault.db; cp $mg/fault.db $OUT/
  fi
  [[ $part == one || $part == all ]] && sweep one 1
  if [[ $part == four ]]; then
    [[ $(nvidia-smi -L | wc -l) -ge 4 ]] || { echo "multi-gpu four needs four GPUs"; exit 1; }
    sweep four 0,1,2,3
  fi
  if [[ -f $mg/one.json && -f $mg/two.json && -f $mg/fault.db ]]; then
    four=(); [[ -f $mg/four.json ]] && four=($mg/four.db)
    python3 -c "import json, os, sys; print(json.dumps({n: json.load(open(f'{sys.argv[1]}/{n}.json'))
                for n in ('one', 'two', 'four') if os.path.exists(f'{sys.argv[1]}/{n}.json')}))" $mg >$mg/times.json
    python3 experiments/multi_gpu_sweep.py $ft $mg/one.db $mg/two.db $mg/times.json $mg/fault.db \
      "$rep/multi_gpu_sweep.csv" "${four[@]}" | tee $OUT/multi_gpu_sweep.txt
    cp "$rep/multi_gpu_sweep.csv" $OUT/
  fi
  ;;
gqa)
  # Issue 16, grouped-query attention: every fa2_mma / fa2_mma_bwd variant validated on ragged GQA and
  # MQA shapes, then both tuned on Llama-3-like shapes (32 or 64 query heads, 8 kv heads, d 128) and
  # timed beside torch SDPA (enable_gqa=True) flash and cuDNN: gqa_vs_peers.csv.
  # "gqa fwd": the validation, the forward sweep and its baselines; "gqa bwd": the backward's, then the
  # comparison (two calls; the store and the baselines travel back in sweep.tar.gz between them).
  # fa2_wgmma_bwd (Hopper), a call each (logs under $OUT); wgmma-check about 7 minutes on a fresh H100 (the
  # build ~2.5 of them), wgmma-time about 7 on the machine wgmma-check left warm (its build then incremental;
  # each step has a time limit: GQA_WGMMA_{VALIDATE,MHA,TUNE,COMPARE}_LIMIT_S, 240, 180, 180, 240 s):
  # "gqa wgmma-check": every compiled variant of its space validated on ragged_gqa_bwd (groups of 2, 3, 4,
  # 6 and 8 with MQA, Sq != Sk both ways, causal and not, d 64/128/256, fp16 and bf16) into gqa_validate.db,
  # then on ragged_mma_bwd (multi-head, every head dim: the group of one through the same loop, and the
  # variants that fit only since the grouped-query change) into wgmma_mha_validate.db;
  # "gqa wgmma-time": its grid space tuned (halving) on gqa_bwd_bf16 into the store beside fa2_mma_bwd's
  # rows, then each point's best of the two families re-timed beside torch SDPA flash and cuDNN
  # (enable_gqa) in one process: gqa_bwd_vs_peers.csv (written after every point). A step stopped by its
  # time limit keeps what it stored; the same call again resumes.
  part=${1:-all}
  case $part in
    fwd | bwd | all | wgmma-check | wgmma-time) ;;
    *) echo "gqa: the part is fwd, bwd, all, wgmma-check or wgmma-time, not '$part'" >&2; exit 2 ;;
  esac
  val=$(validation_store gqa)
  baselines() {  # baselines <problems>: torch SDPA flash and cuDNN (enable_gqa) in this run
    for b in flash cudnn; do
      python3 experiments/sdpa_baseline.py configs/problems/$1.json --backend $b --out "$rep/sdpa_${b}_$1.csv" 2>&1 | tail -1
    done
  }
  if [[ $part == fwd || $part == all ]]; then
    for s in "fa2_mma ragged_gqa" "fa2_mma_bwd ragged_gqa_bwd"; do
      set -- $s
      log "validate $1 on $2"
      $ft tune configs/spaces/$1.json configs/problems/$2.json --db "$val" --quiet --stop-margin 0.5 --retime 0 2>&1 | tail -1
    done
    validation_summary "$val"
    $ft drop-cubins --db "$val"
    TUNE_LIMIT_S=${GQA_FWD_LIMIT_S:-130} tune fa2_mma gqa_bf16
    baselines gqa_bf16
  fi
  if [[ $part == bwd || $part == all ]]; then
    log "tune fa2_mma_bwd on gqa_bwd_bf16 (halving)"
    timeout "${GQA_BWD_LIMIT_S:-240}" $ft tune configs/spaces/fa2_mma_bwd.json configs/problems/gqa_bwd_bf16.json --db "$db" \
      --strategy halving 2>&1 | grep -vE "^\[" | tail -10
    baselines gqa_bwd_bf16
    $ft best --db "$db" --csv | python3 -c "import csv,sys; r=list(csv.DictReader(sys.stdin)); w=csv.DictWriter(sys.stdout, r[0].keys()); w.writeheader(); w.writerows(x for x in r if x['heads_k']!=x['heads'])" >"$rep/best_gqa.csv"
    python3 experiments/compare.py "$rep/best_gqa.csv" "$rep"/sdpa_*_gqa_*.csv --short --out "$rep/gqa_vs_peers.csv"
  fi
  if [[ $part == wgmma-check ]]; then
    validate_wgmma() {  # validate_wgmma <problems> <store> <limit s> <log name>
      log "validate fa2_wgmma_bwd on $1"
      timeout "$3" $ft tune configs/spaces/fa2_wgmma_bwd.json configs/problems/$1.json \
        --db "$2" --stop-margin 0.5 --retime 0 >"$OUT/$4.log" 2>&1
      echo "tune exit $? (124: stopped by its time limit; run again to resume)"
      grep -vE "^\[" "$OUT/$4.log" | tail -4
      validation_summary "$2" || echo "FAIL: a compiled variant did not validate"
      $ft drop-cubins --db "$2"
    }
    validate_wgmma ragged_gqa_bwd "$val" "${GQA_WGMMA_VALIDATE_LIMIT_S:-240}" gqa_wgmma_validate
    validate_wgmma ragged_mma_bwd "$(validation_store wgmma_mha)" "${GQA_WGMMA_MHA_LIMIT_S:-180}" wgmma_mha_validate
  fi
  if [[ $part == wgmma-time ]]; then
    log "tune fa2_wgmma_bwd_grid on gqa_bwd_bf16 (halving)"
    timeout "${GQA_WGMMA_TUNE_LIMIT_S:-180}" $ft tune configs/spaces/fa2_wgmma_bwd_grid.json configs/problems/gqa_bwd_bf16.json \
      --db "$db" --strategy halving >"$OUT/gqa_wgmma_tune.log" 2>&1
    echo "tune exit $? (124: stopped by its time limit; run again to resume)"
    grep -vE "^\[" "$OUT/gqa_wgmma_tune.log" | tail -10
    log "best of fa2_wgmma_bwd and fa2_mma_bwd per point vs torch SDPA flash and cuDNN (enable_gqa), one process"
    timeout "${GQA_WGMMA_COMPARE_LIMIT_S:-240}" python3 experiments/tuned_vs_sdpa.py --family fa2_wgmma_bwd,fa2_mma_bwd \
      --db "$db" --problems configs/problems/gqa_bwd_bf16.json --flashtune "$ft" --out "$rep/gqa_bwd_vs_peers.csv" \
      >"$OUT/gqa_bwd_vs_peers.log" 2>&1
    echo "comparison exit $?"
    tail -10 "$OUT/gqa_bwd_vs_peers.log"
    cp "$rep/gqa_bwd_vs_peers.csv" "$OUT/" 2>/dev/null
  fi
  finish
  ;;
gqa-peers)
  # Issue 16, grouped-query attention in one run: the Hopper families tuned by halving on the Llama-3-like
  # shapes (fa3_wgmma forward, fa2_wgmma_bwd backward; fa2_mma and fa2_mma_bwd's stored rows beside them),
  # then each point's best re-timed beside torch SDPA flash and cuDNN (enable_gqa) in one process:
  # gqa_vs_peers.csv (forward and backward rows).
  log "tune fa3_wgmma_main on gqa_bf16 (halving)"
  timeout "${GQA_FWD_LIMIT_S:-100}" $ft tune configs/spaces/fa3_wgmma_main.json configs/problems/gqa_bf16.json --db "$db" \
    --strategy halving >"$OUT/gqa_fwd_tune.log" 2>&1
  grep -E "evaluated" "$OUT/gqa_fwd_tune.log" | tail -9
  log "tune fa2_wgmma_bwd_grid on gqa_bwd_bf16 (halving)"
  timeout "${GQA_BWD_LIMIT_S:-150}" $ft tune configs/spaces/fa2_wgmma_bwd_grid.json configs/problems/gqa_bwd_bf16.json --db "$db" \
    --strategy halving >"$OUT/gqa_bwd_tune.log" 2>&1
  grep -E "evaluated" "$OUT/gqa_bwd_tune.log" | tail -6
  log "tuned vs torch SDPA, one process per direction"
  python3 experiments/tuned_vs_sdpa.py --db "$db" --problems configs/problems/gqa_bf16.json --family fa3_wgmma,fa2_mma \
    --out "$OUT/gqa_fwd.csv" 2>"$OUT/gqa_fwd_peers.log" | tail -10
  python3 experiments/tuned_vs_sdpa.py --db "$db" --problems configs/problems/gqa_bwd_bf16.json \
    --family fa2_wgmma_bwd,fa2_mma_bwd --out "$OUT/gqa_bwd.csv" 2>"$OUT/gqa_bwd_peers.log" | tail -8
  python3 - "$OUT/gqa_fwd.csv" "$OUT/gqa_bwd.csv" "$rep/gqa_vs_peers.csv" <<'PY'
import csv, sys
rows = [r for f in sys.argv[1:3] for r in csv.DictReader(open(f))]
keys = list(dict.fromkeys(k for r in rows for k in r))
with open(sys.argv[3], "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
PY
  finish
  ;;
fa3)
  # Issue 14, fa3_wgmma. "fa3 check": the sample space validated on ragged shapes (every head dim, fp16
  # and bf16, causal and not, Sq != Sk both ways, Sq = 1, grouped- and multi-query); "fa3 time": the
  # grid space tuned (halving) on the bf16 grid, then each point's best re-timed beside FlashAttention-3's
  # fixed table through our template and torch SDPA flash and cuDNN in one process:
  # fwd_hopper_vs_peers.csv. "fa3 all": both. "fa3 spot [problems]": the grid space on a few points.
  # "fa3 peers": the op's forward beside torch's backends and the FA3-class kernel (fwd_op_vs_peers.csv).
  # "fa3 validate SPACE": one space's variants validated (a new switch, before the whole sample).
  # "fa3 profile": Nsight Compute on our forward, FA3-class's and cuDNN's at the worst points (below).
  part=${1:-check}
  val=$(validation_store fa3)
  if [[ $part == check || $part == all ]]; then
    rm -f "$val"
    for probs in ragged_mma ragged_gqa; do
      log "validate fa3_wgmma_sample on $probs"
      $ft tune configs/spaces/fa3_wgmma_sample.json configs/problems/$probs.json --db "$val" --quiet --stop-margin 0.5 \
        --retime 0 2>&1 | tail -2
    done
    validation_summary "$val"
    $ft drop-cubins --db "$val"
  fi
  if [[ $part == time || $part == all || $part == tune ]]; then
    # The grid space's first halving round is ~1600 validated runs (~9 min on an H100): "fa3 tune" stops at
    # FA3_TIME_LIMIT_S and a later "fa3 time" resumes it from the store, within FA3_TIME_BUDGET (each problem
    # an equal share of what is left, so every problem gets a pick), then times the picks.
    log "tune fa3_wgmma_grid on anchors_bf16 (halving)"
    budget=()
    [[ -n ${FA3_TIME_BUDGET:-} ]] && budget=(--time-budget "$FA3_TIME_BUDGET")
    timeout "${FA3_TIME_LIMIT_S:-450}" $ft tune configs/spaces/fa3_wgmma_grid.json configs/problems/anchors_bf16.json \
      --db "$db" --strategy halving "${budget[@]}" 2>&1 | grep -vE "^\[" | tail -4
  fi
  if [[ $part == time || $part == all ]]; then
    log "re-timed beside FlashAttention-3's table, torch flash and cuDNN"
    python3 experiments/tuned_vs_sdpa.py --db "$db" --problems configs/problems/anchors_bf16.json --family fa3_wgmma \
      --flashtune "$ft" --out "$rep/fwd_hopper_vs_peers.csv" 2>/dev/null
  fi
  if [[ $part == peers ]]; then  # fa3 peers: the op's forward (the store's picks) beside torch SDPA flash, cuDNN and the
    # FA3-class kernel (FA4's sm90, if .fa4a/.fa4b installed it), one process, profiler kernel time: fwd_op_vs_peers.csv
    log "forward peers, one process, profiler kernel time"
    # FA3_PEERS_DB=none: the runtime's tables alone (what a user's call runs); FA3_PEERS_PROBLEMS (names under
    # configs/problems) and FA3_PEERS_OUT (the CSV's stem) for a subset.
    dbarg=(--db "${FA3_PEERS_DB:-$db}")
    [[ ${FA3_PEERS_DB:-} == none ]] && dbarg=()
    probs=()
    for p in ${FA3_PEERS_PROBLEMS:-anchors_bf16 gqa_bf16}; do probs+=("configs/problems/$p.json"); done
    pout=${FA3_PEERS_OUT:-fwd_op_vs_peers}
    with_peers timeout "${FA3_PEERS_LIMIT_S:-240}" python3 experiments/fwd_peers.py "${dbarg[@]}" --problems "${probs[@]}" \
      --out "$rep/$pout.csv" 2>"$OUT/fwd_peers.log"
    echo "fwd peers exit $?"; tail -22 "$OUT/fwd_peers.log"; cp "$rep/$pout.csv" "$rep/${pout}_kernels.csv" "$OUT/" 2>/dev/null
  fi
  if [[ $part == validate ]]; then  # fa3 validate SPACE: its compiled variants validated on ragged_mma and
    # ragged_gqa into the validation store (earlier rows kept), 5 s per run at most (a hang costs 5 s, not 30)
    for probs in ragged_mma ragged_gqa; do
      log "validate $2 on $probs"
      timeout "${FA3_VALIDATE_LIMIT_S:-200}" $ft tune configs/spaces/$2.json configs/problems/$probs.json --db "$val" \
        --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -2
    done
    validation_summary "$val"
  fi
  if [[ $part == profile ]]; then  # fa3 profile: Nsight Compute on fa3_wgmma_fwd, the FA3-class and cuDNN forwards at
    # each FA3_PROFILE_POINTS entry (profile_points; default: the H200 table's picks at its worst forward points against
    # FA3-class and cuDNN, d 64 and 128 causal 4k, d 128 causal 1k)
    profile_points fwd fa3_profile "${FA3_PROFILE_POINTS:-BLOCK_N=128,CONSUMERS=3,STAGES=2,OVERLAP=1,PINGPONG=0,P_SMEM=0,PERSISTENT=0,TWO_CTAS=0,MULTICAST=0;4,32,4096,4096,64;1|BLOCK_N=128,CONSUMERS=2,STAGES=2,OVERLAP=1,PINGPONG=0,P_SMEM=0,PERSISTENT=0,TWO_CTAS=0,MULTICAST=0;4,16,4096,4096,128;1|BLOCK_N=128,CONSUMERS=2,STAGES=2,OVERLAP=1,PINGPONG=1,P_SMEM=0,PERSISTENT=0,TWO_CTAS=0,MULTICAST=0;16,16,1024,1024,128;1}"
  fi
  if [[ $part == spot ]]; then  # fa3 spot [problems]: a space (FA3_SPOT_SPACE, the grid's) tuned exhaustively
    # on a few points into FA3_SPOT_DB (results.db), each point's best re-timed beside the peers
    probs=${2:-spot_fa3_causal_1k} space=${FA3_SPOT_SPACE:-fa3_wgmma_grid} sdb=${FA3_SPOT_DB:-$db}
    log "tune $space on $probs (exhaustive) into $sdb"
    timeout "${FA3_SPOT_LIMIT_S:-400}" $ft tune configs/spaces/$space.json configs/problems/$probs.json --db "$sdb" 2>&1 |
      grep -vE "^\[" | tail -4
    python3 experiments/tuned_vs_sdpa.py --db "$sdb" --problems configs/problems/$probs.json --family fa3_wgmma \
      --flashtune "$ft" --out "$rep/fwd_hopper_$probs.csv" 2>/dev/null
    [[ $sdb == "$db" ]] || $ft drop-cubins --db "$sdb"
  fi
  finish
  ;;
fa3-bwd)
  # Issue 29, fa3_wgmma_bwd (FlashAttention-3's backward design). Parts, in the order given (default: check spot):
  #   check - every compiled variant of configs/spaces/fa3_wgmma_bwd.json (FA3_BWD_CHECK_SPACE: another space)
  #           validated on ragged_mma_bwd and ragged_gqa_bwd (Sq != Sk both ways, causal and not, GQA/MQA,
  #           fp16/bf16) into fa3_bwd_validate.db
  #   spot  - a few configs timed at S 4k beside fa2_wgmma_bwd's stored picks (the harness's timer)
  #   tune  - fa3_wgmma_bwd_grid tuned exhaustively on the bf16 grid's d 64/128 points and the GQA points
  #   profile - Nsight Compute sections and per-instruction stall samples of one dK/dV kernel
  #   peers - each point's best backward (fa3_wgmma_bwd, fa2_wgmma_bwd, fa2_mma_bwd) through flashtune.torch beside
  #           torch SDPA flash, cuDNN and the FA3-class kernel (FA4's sm90, if installed), one process, profiler
  #           kernel time: bwd_hopper_vs_peers.csv
  #   short - fa3_wgmma_bwd_short.json exhaustively on the long points (S 16k, GQA 8k; FA3_BWD_SHORT_PROBLEMS: names
  #           under configs/problems) into fa3_bwd_short.db (rows there kept: a second call adds); FA3_BWD_SHORT_SPACE
  #           and FA3_BWD_SHORT_DB (names under configs/spaces and reports/<gpu>) another space and store
  #           (peers then with FA3_BWD_PEERS_DB=<it>, FA3_BWD_PEERS_PROBLEMS=<files>, FA3_BWD_PEERS_OUT=<csv stem>);
  #           FA3_BWD_SHORT_PAUSE_US: tune's --pause-us (the GPU idle before each timed repeat)
  #   regime - the harness's timing regime against the peers' timer: FA3_BWD_REGIME_SPACE (fa3_wgmma_bwd_dqt_time)
  #           tuned exhaustively on FA3_BWD_REGIME_PROBLEMS (spot_bwd_d128_s4k) with the repeats back to back and with
  #           FA3_BWD_REGIME_PAUSE_US (2000) before each, into two stores of this run; then each store's four fastest
  #           timed as bwd_peers times the op (experiments/probes/bwd_config_ab.py): bwd_regime_*.csv, bwd_regime.txt
  #   det   - DETERMINISTIC 1 validated (5 bitwise-equal runs per config) and tuned (halving) on the grid
  parts=("$@")
  ((${#parts[@]})) || parts=(check spot)
  val=$(validation_store fa3_bwd)
  for part in "${parts[@]}"; do
    case $part in
      check)
        for probs in ragged_mma_bwd ragged_gqa_bwd; do
          log "validate fa3_wgmma_bwd on $probs"
          timeout "${FA3_BWD_VALIDATE_LIMIT_S:-200}" $ft tune "${FA3_BWD_CHECK_SPACE:-configs/spaces/fa3_wgmma_bwd.json}" \
            configs/problems/$probs.json \
            --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -2
        done
        validation_summary "$val"
        $ft drop-cubins --db "$val"
        ;;
      spot)  # FA3_BWD_SPOT: "params shape" pairs (default: the d 64 and d 128 picks at S 4k and 16k, SCHED 0 and 2)
        spot=${FA3_BWD_SPOT:-"BLOCK_M=128,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1 4,32,4096,4096,64;BLOCK_M=128,CONSUMERS=2,STAGES=2,SCHED=2,DQ_OVERLAP=1 4,32,4096,4096,64;BLOCK_M=128,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=0 1,32,16384,16384,64;BLOCK_M=128,CONSUMERS=2,STAGES=2,SCHED=2,DQ_OVERLAP=0 1,32,16384,16384,64;BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1 4,16,4096,4096,128;BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=2,DQ_OVERLAP=1 4,16,4096,4096,128;BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1 1,16,16384,16384,128;BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=2,DQ_OVERLAP=1 1,16,16384,16384,128"}
        IFS=';' read -ra specs <<<"$spot"
        for spec in "${specs[@]}"; do
          set -- $spec
          for c in "" "--causal"; do
            $ft run --family fa3_wgmma_bwd --params "$1" --shape "$2" --dtype bf16 $c --direction bwd 2>&1 |
              grep -E "TFLOP|error" | tr '\n' ' '; echo " <- $1 $2 $c"
          done
        done | tee "$OUT/fa3_bwd_spot.txt"
        ;;
      tune)
        for probs in anchors_bwd_bf16 gqa_bwd_bf16; do
          log "tune fa3_wgmma_bwd_grid on $probs"
          timeout "${FA3_BWD_TUNE_LIMIT_S:-240}" $ft tune configs/spaces/fa3_wgmma_bwd_grid.json configs/problems/$probs.json \
            --db "$db" --timeout 10 2>&1 | grep -vE "^\[" | tail -3
        done
        $ft best --db "$db" --family fa3_wgmma_bwd --csv >"$rep/best_fa3_wgmma_bwd.csv"
        ;;
      short)  # fa3_wgmma_bwd_short.json exhaustively on the long points (anchors_bwd_long_bf16) into fa3_bwd_short.db
        sspace=${FA3_BWD_SHORT_SPACE:-fa3_wgmma_bwd_short} sdb=$rep/${FA3_BWD_SHORT_DB:-fa3_bwd_short.db}
        for probs in ${FA3_BWD_SHORT_PROBLEMS:-anchors_bwd_long_bf16}; do
          log "tune $sspace on $probs (exhaustive)"
          timeout "${FA3_BWD_SHORT_LIMIT_S:-300}" $ft tune "configs/spaces/$sspace.json" \
            configs/problems/$probs.json --db "$sdb" --timeout 10 ${FA3_BWD_SHORT_PAUSE_US:+--pause-us "$FA3_BWD_SHORT_PAUSE_US"} \
            2>&1 | grep -vE "^\[|^tune " | tail -14
        done
        $ft drop-cubins --db "$sdb"; cp "$sdb" "$OUT/"
        ;;
      peers)
        log "backward peers, one process, profiler kernel time"
        with_peers timeout "${FA3_BWD_PEERS_LIMIT_S:-300}" python3 experiments/bwd_peers.py --db "${FA3_BWD_PEERS_DB:-$db}" \
          --problems ${FA3_BWD_PEERS_PROBLEMS:-configs/problems/anchors_bwd_bf16.json configs/problems/gqa_bwd_bf16_2k8k.json} \
          --out "$rep/${FA3_BWD_PEERS_OUT:-bwd_hopper_vs_peers}.csv" 2>"$OUT/bwd_peers.log"
        echo "peers exit $?"; tail -5 "$OUT/bwd_peers.log"
        cp "$rep/${FA3_BWD_PEERS_OUT:-bwd_hopper_vs_peers}.csv" "$rep/${FA3_BWD_PEERS_OUT:-bwd_hopper_vs_peers}_kernels.csv" "$OUT/" 2>/dev/null
        ;;
      profile)  # Nsight Compute on the dK/dV kernel at each FA3_BWD_PROFILE_POINTS entry (profile_points), and on the
                # FA3-class and cuDNN backward kernels at the same shapes
        PROFILE_OURS=${FA3_BWD_PROFILE_OURS:-1} profile_points bwd fa3_bwd_profile \
          "${FA3_BWD_PROFILE_POINTS:-BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1;4,16,4096,4096,128;0}"
        ;;
      regime)
        rspace=${FA3_BWD_REGIME_SPACE:-fa3_wgmma_bwd_dqt_time} rprobs=${FA3_BWD_REGIME_PROBLEMS:-spot_bwd_d128_s4k}
        for pause in 0 "${FA3_BWD_REGIME_PAUSE_US:-2000}"; do
          rdb=$rep/bwd_regime_pause$pause.db
          rm -f "$rdb"
          log "tune $rspace on $rprobs, --pause-us $pause"
          timeout "${FA3_BWD_REGIME_LIMIT_S:-150}" $ft tune "configs/spaces/$rspace.json" "configs/problems/$rprobs.json" \
            --db "$rdb" --timeout 10 --pause-us "$pause" 2>&1 | grep -vE "^\[|^tune " | tail -3
          python3 - "$rdb" >"$OUT/regime_top_$pause.txt" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for cfg, ms in c.execute("select config, ms_median from results where status = 'ok' order by ms_median limit 4"):
    print(f"{ms:.4f} {cfg}")
PY
          cat "$OUT/regime_top_$pause.txt"
        done
        shape=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["problems"][0]
print("%d,%d,%d,%d" % (p["batch"], p["heads"], p["seq_q"], p["head_dim"]), "--causal" if p.get("causal") else "")' \
          "configs/problems/$rprobs.json")
        configs=$(cat "$OUT"/regime_top_*.txt | awk '{print $2}' | sort -u | paste -sd';')
        log "the stores' fastest, timed as bwd_peers times the op"
        with_peers timeout "${FA3_BWD_REGIME_AB_LIMIT_S:-240}" python3 experiments/probes/bwd_config_ab.py \
          --db "$rep/bwd_regime_pause0.db" --shape $shape --configs "$configs" --rounds 4 \
          --out "$rep/bwd_regime_ab.csv" 2>&1 | tee "$rep/bwd_regime.txt"
        $ft drop-cubins --db "$rep/bwd_regime_pause0.db"; $ft drop-cubins --db "$rep/bwd_regime_pause${FA3_BWD_REGIME_PAUSE_US:-2000}.db"
        cp "$rep"/bwd_regime* "$OUT/" 2>/dev/null
        ;;
      det)  # DETERMINISTIC 1 and DQ_STAGES 2: every compiled variant with either validated on the ragged shapes (a
            # deterministic one held to 5 bitwise-equal runs), then, by halving, the picks' neighbourhood (two
            # consumers, STAGES 2, SCHED 0) on the bf16 grid's d 64/128 points: the
            # deterministic configs (DQ_STAGES 1, 2) and the non-deterministic ones with DQ_STAGES 2, into
            # FA3_BWD_TUNE_DB (default: the store)
        dspace=$OUT/fa3_bwd_det_space.json
        narrow() {  # $1 a space of fa3_wgmma_bwd, $2 a JSON object of params -> $dspace
          python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s["params"].update(json.loads(sys.argv[2]))
s["description"] = sys.argv[1] + " with " + sys.argv[2]; json.dump(s, open(sys.argv[3], "w"))' "$1" "$2" "$dspace"
        }
        vdefault='{"DETERMINISTIC": [1, 2], "SCHED": [0, 1]}|{"DQ_STAGES": [2], "SCHED": [0, 1]}'
        IFS='|' read -ra vspaces <<<"${FA3_BWD_DET_VALIDATE_SPACES:-$vdefault}"  # spaces split by '|'; "none": none
        [[ ${vspaces[0]:-} == none ]] && vspaces=()
        for space in "${vspaces[@]}"; do
          narrow configs/spaces/fa3_wgmma_bwd.json "$space"
          for probs in ragged_mma_bwd ragged_gqa_bwd; do
            log "validate fa3_wgmma_bwd $space on $probs"
            timeout "${FA3_BWD_DET_VALIDATE_LIMIT_S:-100}" $ft tune "$dspace" configs/problems/$probs.json \
              --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -1
          done
        done
        validation_summary "$val"
        $ft drop-cubins --db "$val"
        tdb=${FA3_BWD_TUNE_DB:-$db}
        near='"CONSUMERS": [2], "STAGES": [2], "SCHED": [0]'
        tdefault="{$near, \"DETERMINISTIC\": [1, 2]}|{$near, \"DETERMINISTIC\": [0], \"DQ_STAGES\": [2]}"
        IFS='|' read -ra tspaces <<<"${FA3_BWD_DET_TUNE_SPACES:-$tdefault}"
        for space in "${tspaces[@]}"; do
          narrow configs/spaces/fa3_wgmma_bwd_grid.json "$space"
          for probs in ${FA3_BWD_DET_TUNE_PROBLEMS:-anchors_bwd_bf16_d64 anchors_bwd_bf16_d128_256}; do  # (GQA rows: no table bucket)
            log "tune fa3_wgmma_bwd $space on $probs (halving)"
            timeout "${FA3_BWD_DET_TUNE_LIMIT_S:-60}" $ft tune "$dspace" configs/problems/$probs.json \
              --db "$tdb" --strategy halving --timeout 10 2>&1 | grep -vE "^\[" | tail -1
          done
        done
        $ft best --db "$tdb" --family fa3_wgmma_bwd --deterministic --csv >"$rep/best_fa3_wgmma_bwd_deterministic.csv"
        $ft best --db "$tdb" --family fa3_wgmma_bwd --csv >"$rep/best_fa3_wgmma_bwd.csv"
        cp "$rep/best_fa3_wgmma_bwd_deterministic.csv" "$rep/best_fa3_wgmma_bwd.csv" "$OUT/"
        [[ $tdb == "$db" ]] || cp "$tdb" "$OUT/"
        ;;
      *) echo "fa3-bwd: unknown part $part" >&2; exit 2 ;;
    esac
  done
  finish
  ;;
fa3-short)
  # fa3_wgmma's two CTAs per SM (TWO_CTAS 1) at the points still below cuDNN. (i) every compiled variant of
  # fa3_wgmma_2cta.json validated on ragged shapes into fa3_validate.db (its earlier rows kept); (ii) the
  # short space (the picks' neighbourhood, TWO_CTAS 0 and 1) tuned by halving on anchors_fa3_missed.json
  # into a store of this run alone (fa3_short.db: the picks and the bests with and without TWO_CTAS are timed in one
  # run); (iii) each point's best re-timed beside FlashAttention-3's table, torch flash and cuDNN in one
  # process: fwd_short_vs_peers.csv. Each step under its own limit.
  # FA3_SHORT_PROBLEMS names the problem set (default anchors_fa3_missed, the H100's); FA3_SHORT_VALIDATE=0 skips (i)
  # (the tuner validates every candidate before timing it anyway); FA3_SHORT_PEERS=0 skips (iii); FA3_SHORT_MERGE=1
  # merges the run's store into results.db, so that finish emits the tables with its picks.
  probs_short=${FA3_SHORT_PROBLEMS:-anchors_fa3_missed}
  val=$(validation_store fa3)
  sdb=$rep/fa3_short.db
  [[ $probs_short == anchors_fa3_missed ]] || sdb=$rep/fa3_short_${probs_short#anchors_fa3_missed_}.db
  rm -f "$sdb"
  run_limit=${FA3_SHORT_RUN_TIMEOUT_S:-15}  # per candidate run (each takes well under 1 s): a hang costs 15 s, not 30
  [[ ${FA3_SHORT_VALIDATE:-1} == 0 ]] || for probs in ragged_mma ragged_gqa; do
    log "validate fa3_wgmma_2cta on $probs"
    timeout "${FA3_SHORT_VALIDATE_LIMIT_S:-90}" $ft tune configs/spaces/fa3_wgmma_2cta.json configs/problems/$probs.json \
      --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout "$run_limit" 2>&1 | tail -2
  done
  if [[ ${FA3_SHORT_VALIDATE:-1} != 0 ]]; then
    validation_summary "$val"
    $ft drop-cubins --db "$val"
  fi
  log "tune fa3_wgmma_short on $probs_short (halving)"
  budget=()
  [[ -n ${FA3_SHORT_BUDGET:-} ]] && budget=(--time-budget "$FA3_SHORT_BUDGET")
  timeout "${FA3_SHORT_TUNE_LIMIT_S:-170}" $ft tune configs/spaces/fa3_wgmma_short.json \
    "configs/problems/$probs_short.json" --db "$sdb" --strategy halving "${budget[@]}" --timeout "$run_limit" 2>&1 |
    grep -vE "^\[" | tail -6
  python3 - "$sdb" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
q = ("select head_dim, causal, seq_q, instr(config, 'TWO_CTAS=1') > 0, max(tflops), config from results "
     "where status = 'ok' group by head_dim, causal, seq_q, instr(config, 'TWO_CTAS=1') > 0 order by 1, 2, 3, 4")
for d, causal, s, two, tf, cfg in c.execute(q):
    print(f"best d {d} causal {causal} S {s} TWO_CTAS {1 if two else 0}: {tf:.1f} TFLOP/s {cfg}")
PY
  if [[ ${FA3_SHORT_PEERS:-1} != 0 ]]; then
    log "re-timed beside FlashAttention-3's table, torch flash and cuDNN"
    timeout "${FA3_SHORT_PEERS_LIMIT_S:-110}" python3 experiments/tuned_vs_sdpa.py --db "$sdb" \
      --problems "configs/problems/$probs_short.json" --family fa3_wgmma --flashtune "$ft" \
      --out "$rep/fwd_short_vs_peers.csv" 2>"$OUT/fa3_short_peers.log"
  fi
  $ft drop-cubins --db "$sdb"
  if [[ ${FA3_SHORT_MERGE:-0} == 1 ]]; then
    log "merge $sdb into $db"
    $ft merge "$sdb" -o "$db" --quiet
  fi
  finish
  ;;
varlen)
  # Issue 16, packed variable-length batches (never run on a GPU before this stage). Parts, in the order given
  # (default: all of them, more than one call's 10 minutes):
  #   check - every compiled variant of configs/spaces/fa2_mma.json and fa2_mma_bwd.json, in its varlen form,
  #           validated on ragged_varlen(_bwd).json (1-token, empty and key-less sequences, lengths no tile
  #           divides, GQA/MQA/MHA, d 64/128, fp16/bf16, causal and not) into varlen_validate.db (~3 min
  #           with the compile of the 544 packed variants the problems need)
  #   fwd   - fa2_mma tuned by halving on varlen_bf16.json (Hq 32, Hk 8 or 32, d 128, bf16, 16k tokens of
  #           uniform [256, 4096] or [64, 1024] lengths, causal and not) into results.db (~2 min)
  #   check-fa3 - every compiled fa3_wgmma_sample.json variant (Hopper: wgmma, TMA) in its varlen form
  #           validated on ragged_varlen.json into varlen_validate.db (~5 min: ~1150 compiles, ~600 runs)
  #   fwd-fa3 - fa3_wgmma_grid.json tuned by halving on varlen_bf16.json (~3 min)
  #   bwd   - fa2_mma_bwd likewise on varlen_bwd_bf16.json (~6-7 min: 104 candidates, each validated once,
  #           comparing every element of dQ, dK, dV (1-2 x 10^8) with a float64 reference of distinct heads; a
  #           part stopped by its limit stores what it ran, and the next "bwd" resumes)
  #   check-wgmma-bwd - every compiled fa2_wgmma_bwd_varlen.json variant (Hopper: wgmma; the packed form's
  #           LOAD 0 (LOAD 1 is pruned in the packed form: it failed this check on the H100), DQ_RED 0-3,
  #           SPLIT 0-2, BLOCK_M 64/128, d 64/128, fp16/bf16) validated on ragged_varlen_bwd.json into
  #           varlen_validate.db (~1 min; limit VARLEN_CHECK_WGMMA_BWD_LIMIT_S, 420 s; resumable)
  #   bwd-wgmma - fa2_wgmma_bwd_varlen.json's d = 128 bf16 variants tuned by halving on
  #           varlen_bwd_bf16.json into results.db (limit VARLEN_BWD_WGMMA_LIMIT_S, 300 s; resumable)
  #   peers - each point's pick (fwd: the faster of fa3_wgmma's and fa2_mma's; bwd: of fa2_wgmma_bwd's and
  #           fa2_mma_bwd's) re-timed beside torch
  #           flash varlen and cuDNN in one run: reports/<gpu>/varlen_vs_peers.csv (varlen_vs_peers.py, ~5 min)
  # Calls on an H100 (the build is ~2 min of each on a fresh machine): "varlen check fwd" (~7 min),
  # "varlen bwd" (~9), "varlen check-fa3 fwd-fa3" (~9), "varlen bwd peers" (~7: the bwd tuning's rest, if
  # any, then the comparison); fa2_wgmma_bwd's packed form: "varlen check-wgmma-bwd bwd-wgmma" (~8),
  # then "varlen peers" (~7); between
  # them results.db travels back in sweep.tar.gz and must be unpacked into the working tree, so that the
  # next call's tune resumes and its peers find the picks.
  parts=("$@")
  [[ ${#parts[@]} -eq 0 ]] && parts=(check fwd bwd check-fa3 fwd-fa3 check-wgmma-bwd bwd-wgmma peers)
  val=$(validation_store varlen)
  for part in "${parts[@]}"; do
    case $part in
    check)
      for s in "fa2_mma ragged_varlen ${VARLEN_CHECK_FWD_LIMIT_S:-120}" "fa2_mma_bwd ragged_varlen_bwd ${VARLEN_CHECK_BWD_LIMIT_S:-150}"; do
        set -- $s
        log "validate $1 (varlen form) on $2"
        timeout "$3" $ft tune configs/spaces/$1.json configs/problems/$2.json --db "$val" --quiet --stop-margin 0.5 \
          --retime 0 2>&1 | tail -2
      done
      validation_summary "$val" || echo "FAIL: a compiled varlen variant did not validate"
      $ft drop-cubins --db "$val"
      ;;
    check-fa3)
      log "validate fa3_wgmma_sample (varlen form) on ragged_varlen"
      timeout "${VARLEN_CHECK_FA3_LIMIT_S:-330}" $ft tune configs/spaces/fa3_wgmma_sample.json configs/problems/ragged_varlen.json \
        --db "$val" --quiet --stop-margin 0.5 --retime 0 2>&1 | tail -2
      validation_summary "$val" || echo "FAIL: a compiled varlen variant did not validate"
      $ft drop-cubins --db "$val"
      ;;
    check-wgmma-bwd)
      # Its own store: varlen_validate.db keeps the packed LOAD 1 runs that failed before the preprocess's
      # image stores were guarded (fa2_wgmma_bwd_image_row); this one holds the re-validation.
      wval=$(validation_store varlen_bwd_wgmma)
      log "validate fa2_wgmma_bwd_varlen (varlen form) on ragged_varlen_bwd"
      timeout "${VARLEN_CHECK_WGMMA_BWD_LIMIT_S:-420}" $ft tune configs/spaces/fa2_wgmma_bwd_varlen.json \
        configs/problems/ragged_varlen_bwd.json --db "$wval" --quiet --stop-margin 0.5 --retime 0 2>&1 | tail -2
      validation_summary "$wval" || echo "FAIL: a compiled varlen variant did not validate"
      $ft drop-cubins --db "$wval"
      ;;
    bwd-wgmma)
      log "tune fa2_wgmma_bwd_varlen (LOAD 0 and 1) on varlen_bwd_bf16 (halving)"
      timeout "${VARLEN_BWD_WGMMA_LIMIT_S:-300}" $ft tune configs/spaces/fa2_wgmma_bwd_varlen.json \
        configs/problems/varlen_bwd_bf16.json --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -4
      ;;
    fwd-fa3)
      log "tune fa3_wgmma_grid on varlen_bf16 (halving)"
      timeout "${VARLEN_FWD_FA3_LIMIT_S:-240}" $ft tune configs/spaces/fa3_wgmma_grid.json configs/problems/varlen_bf16.json \
        --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -4
      ;;
    fwd)
      log "tune fa2_mma on varlen_bf16 (halving)"
      timeout "${VARLEN_FWD_LIMIT_S:-180}" $ft tune configs/spaces/fa2_mma.json configs/problems/varlen_bf16.json \
        --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -4
      ;;
    bwd)
      log "tune fa2_mma_bwd on varlen_bwd_bf16 (halving)"
      timeout "${VARLEN_BWD_LIMIT_S:-420}" $ft tune configs/spaces/fa2_mma_bwd.json configs/problems/varlen_bwd_bf16.json \
        --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -4
      ;;
    peers)
      log "varlen picks vs torch flash varlen and cuDNN (one run)"
      timeout "${VARLEN_PEERS_LIMIT_S:-330}" python3 experiments/varlen_vs_peers.py --db "$db" \
        --problems configs/problems/varlen_bf16.json --problems configs/problems/varlen_bwd_bf16.json \
        --out "$rep/varlen_vs_peers.csv" --time-limit-s "${VARLEN_PEERS_POINTS_S:-290}" 2>"$OUT/varlen_vs_peers.log"
      tail -3 "$OUT/varlen_vs_peers.log"
      cut -d, -f1-11 "$rep/varlen_vs_peers.csv"
      cp "$rep/varlen_vs_peers.csv" "$OUT/"
      ;;
    *) echo "varlen: unknown part '$part' (check, fwd, bwd, check-fa3, fwd-fa3, check-wgmma-bwd, bwd-wgmma, peers)"; exit 2 ;;
    esac
  done
  finish
  ;;
decode)
  # decode_splitkv (split-KV decoding, never run on a GPU before this stage): every compiled variant validated
  # on ragged_decode.json (Sq 1-16, GQA/MQA/MHA, causal, fp16/bf16, d 64/128/256; halving: every candidate's
  # first round is a validated run), then tuned on decode_bf16.json (Llama-3 8B: Hq 32, Hk 8, d 128, Sq 1,
  # B 1/8/64 x Sk 4k/32k/128k) by halving, then each point's pick re-timed beside torch SDPA (flash, efficient,
  # cuDNN, math; enable_gqa) and a device copy of the same bytes, in one run: decode_vs_peers.csv. About 8 of
  # its 10 minutes on a fresh H100 (build ~2, validation ~2, tuning ~2, comparison ~1.5); each step has a
  # time limit, and a rerun on a warm machine resumes from the stores.
  val=$(validation_store decode)
  log "validate decode_splitkv on ragged_decode"
  timeout "${DECODE_VALIDATE_LIMIT_S:-170}" $ft tune configs/spaces/decode_splitkv.json configs/problems/ragged_decode.json \
    --db "$val" --quiet --strategy halving --retime 0 2>&1 | tail -1
  validation_summary "$val" || echo "FAIL: a compiled decode_splitkv variant did not validate"
  $ft drop-cubins --db "$val"
  log "tune decode_splitkv on decode_bf16 (halving)"
  timeout "${DECODE_TUNE_LIMIT_S:-170}" $ft tune configs/spaces/decode_splitkv.json configs/problems/decode_bf16.json \
    --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -10
  log "decode_splitkv vs torch SDPA and the copy peak"
  timeout "${DECODE_COMPARE_LIMIT_S:-150}" python3 experiments/decode_vs_peers.py --db "$db" \
    --problems configs/problems/decode_bf16.json --out "$rep/decode_vs_peers.csv" 2>"$OUT/decode_vs_peers.log"
  tail -3 "$OUT/decode_vs_peers.log"
  cut -d, -f1-10 "$rep/decode_vs_peers.csv"
  cp "$rep/decode_vs_peers.csv" "$OUT/"
  finish
  ;;
decode-stages)
  # decode_splitkv's deeper K/V rings (STAGES 3, 4) on the lent GPU: the streaming probe (stream_read.cu: each
  # loader's HBM rate at B 64 Sk 32k, beside decode configs, 3 interleaved rounds) into stream_read_<slug>.csv; the
  # STAGES 3/4 variants of decode_splitkv_stages_check.json validated on ragged_decode and ragged_decode_paged(_nhd)
  # into decode_stages_validate.db; decode_splitkv_stages.json tuned (halving) on decode_bf16 into decode_stages.db;
  # per point the best with STAGES 1-2 and with 3-4 (decode_stages_ab.txt).
  log "stream_read probe"
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I templates experiments/probes/stream_read.cu -lcuda \
    -o /tmp/stream_read && timeout "${STREAM_LIMIT_S:-120}" /tmp/stream_read >"$rep/stream_read_$slug.csv"
  cat "$rep/stream_read_$slug.csv" | tail -22; cp "$rep/stream_read_$slug.csv" "$OUT/"
  val=$(validation_store decode_stages)
  for probs in ragged_decode ragged_decode_paged ragged_decode_paged_nhd; do
    log "validate decode_splitkv_stages_check on $probs"
    timeout "${DECODE_VALIDATE_LIMIT_S:-60}" $ft tune configs/spaces/decode_splitkv_stages_check.json \
      configs/problems/$probs.json --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -1
  done
  validation_summary "$val"
  $ft drop-cubins --db "$val"
  sdb=$rep/decode_stages.db
  log "tune decode_splitkv_stages on decode_bf16 (halving)"
  timeout "${DECODE_TUNE_LIMIT_S:-200}" $ft tune configs/spaces/decode_splitkv_stages.json configs/problems/decode_bf16.json \
    --db "$sdb" --strategy halving 2>&1 | grep -vE "^\[" | tail -3
  python3 - "$sdb" <<'PY' | tee "$OUT/decode_stages_ab.txt"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
best = {}
for cfg, b, sk, us in c.execute("select config, batch, seq_k, ms_median * 1000 from results where status = 'ok' and "
                                 "family = 'decode_splitkv' and ms_median > 0"):
    deep = int(cfg.split("STAGES=")[1].split(",")[0]) >= 3
    key = (b, sk)
    if us < best.setdefault(key, {}).get(deep, (1e30, ""))[0]:
        best[key][deep] = (us, cfg)
print("batch seq_k  best_us_stages_1_2  best_us_stages_3_4  speedup  config_3_4  config_1_2")
for key in sorted(best):
    a, d = best[key].get(False, (0, "")), best[key].get(True, (0, ""))
    print(*key, f"{a[0]:.1f}", f"{d[0]:.1f}", f"{a[0] / d[0]:.3f}" if a[0] and d[0] else "-", d[1], a[1])
PY
  $ft drop-cubins --db "$sdb"; cp "$sdb" "$OUT/"
  finish
  ;;
decode-op)
  # Decoding through the op as a serving loop calls it (issue 31): experiments/decode_op_peers.py, flashtune.torch
  # with the committed table beside torch SDPA's backends, call by call, into decode_op_vs_peers.csv.
  export PYTHONPATH=$PWD/python FLASHTUNE_LIBRARY=$PWD/build/runtime/libflashtune_attention.so \
    FLASHTUNE_TORCH_LIBRARY=$PWD/build/python/csrc/libflashtune_torch.so FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ft-cache}
  log "decode through the op beside torch SDPA"
  PYTHONUNBUFFERED=1 timeout "${DECODE_OP_LIMIT_S:-400}" python3 experiments/decode_op_peers.py \
    --out "$rep/decode_op_vs_peers.csv" 2>"$OUT/decode_op_peers.log"
  echo "decode_op_peers exit $?"; tail -3 "$OUT/decode_op_peers.log"
  cut -d, -f1-6,13 "$rep/decode_op_vs_peers.csv"; cp "$rep/decode_op_vs_peers.csv" "$OUT/"
  [[ ${DECODE_OP_KERNELS:-0} == 1 ]] || exit 0  # DECODE_OP_KERNELS=1: where the call's time goes (profiler)
  log "decode op: kernel time against call time"
  timeout 200 python3 experiments/probes/decode_op_kernels.py 2>&1 | tee "$OUT/decode_op_kernels.csv" | grep -v Warning
  ;;
mask)
  # Issue 32 part 3, mask_mod on Hopper: random samples (MASK_EVALS per problem, default 12) of the mask spaces of
  # fa3_wgmma and fa3_wgmma_bwd validated on ragged_mask_mod_bf16.json (the harness materialises each problem's mask
  # on the GPU for the float64 reference) into mask_validate.db; then one masked training-shaped call timed by run
  # beside the same call causal only (documents of 1-4k tokens over S 16k).
  val=$(validation_store mask)
  for fam in fa3_wgmma fa3_wgmma_bwd; do
    log "validate ${fam}_mask on ragged_mask_mod_bf16"
    timeout "${MASK_VALIDATE_LIMIT_S:-150}" $ft tune "configs/spaces/${fam}_mask.json" configs/problems/ragged_mask_mod_bf16.json \
      --db "$val" --strategy random --max-evals "${MASK_EVALS:-12}" --seed 5 --stop-margin 0.5 --retime 0 --timeout 10 2>&1 |
      grep -vE "^\[" | tail -2
  done
  validation_summary "$val"
  $ft drop-cubins --db "$val"
  python3 -c "import struct; L=[1024, 4096, 2048, 3072, 1024, 2048, 3072]; d=[i for i, n in enumerate(L) for _ in range(n)]
open('/tmp/doc16k.bin', 'wb').write(struct.pack('<%di' % len(d), *d))"
  for mm in "" "--mask-mod 'return doc[q_idx] == doc[kv_idx];' --mask-tensor doc=/tmp/doc16k.bin"; do
    for dir in fwd bwd; do
      params=BLOCK_N=128,CONSUMERS=2; [[ $dir == bwd ]] && params=BLOCK_M=64,CONSUMERS=2
      log "run $dir causal 1,16,16384,16384,128 ${mm:+(documents)}"
      eval $ft run --family "$([[ $dir == fwd ]] && echo fa3_wgmma || echo fa3_wgmma_bwd)" --params $params \
        --shape 1,16,16384,16384,128 --dtype bf16 --causal --direction $dir $mm 2>&1 | grep -E "status|time|TFLOP|error" | head -3
    done
  done
  finish
  ;;
mask-configs|space-configs)
  # Configs timed on the op's own shapes, exhaustively (--retime 0), into reports/<gpu>/NAME.db, every row printed
  # (direction, d, S, window, config, ms, TFLOP/s, status) and NAME.txt: which config a modified problem wants,
  # against the plain causal picks the op takes for it. space-configs NAME PROBLEMS SPACE..; mask-configs: issue
  # 32's document masks of variants_peers.py (mask_docs.db; doc_mask_bf16.json, the mask spaces).
  if [[ $stage == mask-configs ]]; then set -- mask_docs configs/problems/doc_mask_bf16.json \
    configs/spaces/fa3_wgmma_mask_docs.json configs/spaces/fa3_wgmma_bwd_mask_docs.json; fi
  name=$1 problems=$2; shift 2
  mdb=$rep/$name.db
  rm -f "$mdb"
  for space in "$@"; do
    log "tune $space on $problems"
    timeout "${CONFIGS_LIMIT_S:-200}" $ft tune "$space" "$problems" --db "$mdb" --strategy exhaustive --retime 0 --timeout 10 2>&1 |
      grep -vE "^\[" | tail -3
  done
  $ft drop-cubins --db "$mdb"
  python3 -c "import sqlite3, sys; c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)
for row in c.execute('select direction, head_dim, seq_q, window_left, config, round(ms_median, 4), round(tflops, 1), status '
                     'from results order by direction, head_dim, seq_q, window_left, ms_median'): print(*row)" "$mdb" >"$OUT/$name.txt"
  cat "$OUT/$name.txt"
  cp "$mdb" "$OUT/"
  ;;
decode-paged)
  # decode_splitkv's paged K/V cache form (never run on a GPU before this stage), in parts (default: all three,
  # ~8-9.5 of the call's 10 minutes on a fresh H100 with the ~2 min build; the parts' limits, 160 + 160 + 120 s,
  # keep the call under 10 minutes; a part cut by its limit keeps what it stored, and "decode-paged tune peers"
  # (or "peers") in the next call resumes):
  #   check - every compiled decode_splitkv.json variant in its paged form validated on ragged_decode_paged.json
  #           (cache lengths 0 to 157 pages, pages of 32 to 768 keys in seeded orders, Sq 1/3/16, GQA/MQA/MHA,
  #           causal, fp16/bf16, d 64/128/256; a config runs where its BLOCK_N divides the page; halving: every
  #           candidate's first round is a validated run) into decode_paged_validate.db (~2.5 min with the compile)
  #   tune  - decode_paged_bf16.json (decode_bf16.json's Llama-3 8B grid from 256-key pages) by halving into
  #           results.db (~2.5 min)
  #   peers - each point's paged pick, the dense pick of the same shape (the decode stage's rows in results.db)
  #           and that config on the paged cache, in one run: decode_paged_vs_dense.csv (decode_vs_peers.py
  #           --paged, ~1.5 min)
  #   check-nhd - the same validation of the token-major kernels (decode_splitkv_*<PagedNhdTraits<...>, true>) on
  #           ragged_decode_paged_nhd.json (ragged_decode_paged.json with "layout": "nhd") into
  #           decode_paged_nhd_validate.db (not in the default parts)
  #   tune-nhd - decode_paged_nhd_bf16.json (the tune part's grid, token-major pools) by halving into its own
  #           decode_paged_nhd.db: its picks and times beside the head-major ones of results.db before any of its
  #           rows join the shared paged buckets (`flashtune best --db ...` on both; not in the default parts)
  parts=("$@")
  [[ ${#parts[@]} -eq 0 ]] && parts=(check tune peers)
  for part in "${parts[@]}"; do
    case $part in
    check|check-nhd)  # check-nhd: the token-major pools (ragged_decode_paged_nhd, decode_paged_nhd_validate.db)
      sfx="" what="paged form"
      [[ $part == check-nhd ]] && sfx=_nhd what="paged form, token-major pools"
      val=$(validation_store "decode_paged$sfx")
      log "validate decode_splitkv ($what) on ragged_decode_paged$sfx"
      timeout "${DECODE_PAGED_VALIDATE_LIMIT_S:-160}" $ft tune configs/spaces/decode_splitkv.json \
        "configs/problems/ragged_decode_paged$sfx.json" --db "$val" --quiet --strategy halving --retime 0 2>&1 | tail -1
      validation_summary "$val" || echo "FAIL: a compiled decode_splitkv variant did not validate ($what)"
      $ft drop-cubins --db "$val"
      ;;
    tune)
      log "tune decode_splitkv (paged form) on decode_paged_bf16 (halving)"
      timeout "${DECODE_PAGED_TUNE_LIMIT_S:-160}" $ft tune configs/spaces/decode_splitkv.json \
        configs/problems/decode_paged_bf16.json --db "$db" --strategy halving 2>&1 | grep -vE "^\[" | tail -10
      finish  # packed now too: the comparison below may be cut by the call's limit
      ;;
    peers)
      log "decode_splitkv paged picks vs dense picks"
      timeout "${DECODE_PAGED_COMPARE_LIMIT_S:-120}" python3 experiments/decode_vs_peers.py --paged --db "$db" \
        --problems configs/problems/decode_paged_bf16.json --out "$rep/decode_paged_vs_dense.csv" \
        2>"$OUT/decode_paged_vs_dense.log"
      tail -3 "$OUT/decode_paged_vs_dense.log"
      cut -d, -f1-13 "$rep/decode_paged_vs_dense.csv"
      cp "$rep/decode_paged_vs_dense.csv" "$OUT/"
      ;;
    tune-nhd)
      log "tune decode_splitkv (paged form, token-major pools) on decode_paged_nhd_bf16 (halving)"
      timeout "${DECODE_PAGED_TUNE_LIMIT_S:-160}" $ft tune configs/spaces/decode_splitkv.json \
        configs/problems/decode_paged_nhd_bf16.json --db "$rep/decode_paged_nhd.db" --strategy halving 2>&1 |
        grep -vE "^\[" | tail -10
      $ft best --db "$rep/decode_paged_nhd.db" 2>&1 | tail -12
      $ft drop-cubins --db "$rep/decode_paged_nhd.db"
      ;;
    *) echo "decode-paged: unknown part '$part' (check, tune, peers, check-nhd, tune-nhd)"; exit 2 ;;
    esac
  done
  finish
  ;;
split-compare)
  # A candidate fa2_wgmma_bwd.cuh ($1, default .split/fa2_wgmma_bwd.cuh: carried, never committed) against
  # the committed one in one call: a second build with it, every compiled variant of a 384-variant sample
  # validated on ragged backward shapes, then each bwd grid point's tuned config timed by both builds,
  # interleaved (experiments/ab_builds.py; the configs tuned on the H200 grid): wgmma_split_ab.csv.
  # $1 a directory: its files laid over the tree by their paths (e.g. .split/templates/fa2_wgmma_bwd*.h*,
  # the other side of a change that touched several files). SPLIT_VALIDATE_LIMIT_S=0 skips the validation.
  # SPLIT_FAMILY=fa3_wgmma_bwd: that family instead (its sample space validated on ragged_mma_bwd and
  # ragged_gqa_bwd, its picks of AB_CONFIGS_DB timed on the bwd grid and the GQA points). AB_DETERMINISTIC=1: the
  # deterministic picks instead (a change to the ordered dQ additions); SPLIT_VALIDATE_SPACE: the space validated.
  fam=${SPLIT_FAMILY:-fa2_wgmma_bwd}
  [[ $fam == fa2_wgmma_bwd || $fam == fa3_wgmma_bwd ]] || { echo "split-compare: SPLIT_FAMILY fa2_wgmma_bwd or fa3_wgmma_bwd" >&2; exit 2; }
  cand=${1:-.split/fa2_wgmma_bwd.cuh}
  log "second build with $cand"
  rm -rf /tmp/ab && mkdir -p /tmp/ab
  tar cf - --exclude=./build --exclude='./build-*' --exclude=./reports --exclude=./.git . | tar xf - -C /tmp/ab
  if [[ -d $cand ]]; then cp -r "$cand"/. /tmp/ab/; else cp "$cand" /tmp/ab/templates/fa2_wgmma_bwd.cuh; fi
  if ! (cd /tmp/ab && cmake --preset release -DFLASHTUNE_BENCHMARKS=OFF "${extra[@]}" &&
        cmake --build build -j"$(nproc)" --target flashtune flashtune-worker) >"$OUT/build_ab.log" 2>&1; then
    tail -30 "$OUT/build_ab.log"; exit 1
  fi
  cat >/tmp/ab_space.json <<'JSON'
{"family": "fa2_wgmma_bwd", "params": {"BLOCK_M": [64], "BLOCK_N": [64, 128], "SPLIT": [0, 1, 2], "STAGES": [1, 2],
 "DQ_RED": [0, 1, 2, 3], "LOAD": [0, 1]}, "head_dims": [64, 128, 192, 256], "causal": [false, true], "dtypes": ["bf16"]}
JSON
  vspace=/tmp/ab_space.json vprobs=(ragged_mma_bwd) abprobs=(configs/problems/anchors_bwd_bf16.json)
  if [[ $fam == fa3_wgmma_bwd ]]; then
    vspace=configs/spaces/fa3_wgmma_bwd_sample.json vprobs=(ragged_mma_bwd ragged_gqa_bwd)
    abprobs+=(configs/problems/gqa_bwd_bf16_2k8k.json)
  fi
  vspace=${SPLIT_VALIDATE_SPACE:-$vspace}  # another space to validate (e.g. the deterministic variants)
  [[ ${SPLIT_VALIDATE_LIMIT_S:-200} == 0 ]] || {
  rm -f /tmp/ab_val.db
  for probs in "${vprobs[@]}"; do
    log "validate the candidate's sample on $probs"
    timeout "${SPLIT_VALIDATE_LIMIT_S:-200}" /tmp/ab/build/flashtune tune "$vspace" configs/problems/$probs.json \
      --db /tmp/ab_val.db --quiet --stop-margin 0.5 --retime 0 --timeout 5 >>"$OUT/ab_validate.log" 2>&1; tail -1 "$OUT/ab_validate.log"
  done
  validation_summary /tmp/ab_val.db || echo "FAIL: a compiled variant of the candidate did not validate"
  }
  log "A/B on the bwd grid"
  # its tuned grid (AB_DETERMINISTIC=1: the deterministic picks, `best --deterministic`)
  $ft best --db "${AB_CONFIGS_DB:-reports/nvidia-h200/results.db}" --family "$fam" --csv \
    ${AB_DETERMINISTIC:+--deterministic} >/tmp/ab_configs.csv
  rm -rf /tmp/ab_out && mkdir -p /tmp/ab_out
  for probs in "${abprobs[@]}"; do
    python3 experiments/ab_builds.py --a "$ft" --b /tmp/ab/build/flashtune --configs /tmp/ab_configs.csv --db /tmp/ab.db \
      --problems "$probs" --family "$fam" --max-seq "${SPLIT_MAX_SEQ:-4096}" \
      --out "/tmp/ab_out/$(basename "$probs" .json).csv" >>"$OUT/ab.log" 2>&1
  done
  cat "$OUT/ab.log"
  python3 - "$rep/${AB_OUT:-wgmma_split_ab}.csv" /tmp/ab_out/*.csv <<'PY'
import csv, sys
rows = [r for f in sys.argv[2:] for r in csv.DictReader(open(f))]
if rows:
    with open(sys.argv[1], "w", newline="") as out:
        w = csv.DictWriter(out, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
PY
  cp "$rep/${AB_OUT:-wgmma_split_ab}.csv" "$OUT/"
  ;;
fa2-det-sched)
  # fa2_wgmma_bwd's SCHED 1 and 3 (pairs first: in one group, or in groups whose Q and dO fit L2) for the
  # deterministic d 256 backward: every compiled variant of fa2_wgmma_bwd_sched_check.json validated on the ragged
  # backward shapes, dense, GQA, packed, and pairs that leave the last group part-empty (ragged_pair_groups_bwd, where
  # fa3_wgmma_bwd's SCHED 3 sample is validated too), the deterministic ones held to 5 bitwise-equal runs
  # (fa2_sched_validate.db); then fa2_wgmma_bwd_det_sched.json exhaustively on the grid's d 256 points, SCHED 0, 1
  # and 3 side by side (fa2_det_sched.db, apart from results.db)
  val=$(validation_store fa2_sched)
  for probs in ragged_mma_bwd ragged_gqa_bwd ragged_varlen_bwd ragged_pair_groups_bwd; do
    log "validate fa2_wgmma_bwd_sched_check on $probs"
    timeout "${FA2_SCHED_VALIDATE_LIMIT_S:-100}" $ft tune configs/spaces/fa2_wgmma_bwd_sched_check.json \
      configs/problems/$probs.json --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -1
  done
  log "validate fa3_wgmma_bwd_sched3_check on ragged_pair_groups_bwd"
  timeout "${FA2_SCHED_VALIDATE_LIMIT_S:-100}" $ft tune configs/spaces/fa3_wgmma_bwd_sched3_check.json \
    configs/problems/ragged_pair_groups_bwd.json --db "$val" --quiet --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | tail -1
  validation_summary "$val" || echo "FAIL: a compiled variant did not validate"
  $ft drop-cubins --db "$val"
  sdb=$rep/fa2_det_sched.db
  log "tune fa2_wgmma_bwd_det_sched on the grid's d 256 points (exhaustive)"
  timeout "${FA2_SCHED_TUNE_LIMIT_S:-300}" $ft tune configs/spaces/fa2_wgmma_bwd_det_sched.json \
    configs/problems/anchors_bwd_bf16_d256.json --db "$sdb" --timeout 10 2>&1 | grep -vE "^\[|^tune " | tail -14
  $ft best --db "$sdb" --family fa2_wgmma_bwd --deterministic --csv >"$OUT/fa2_det_sched_best.csv"
  $ft drop-cubins --db "$sdb"; cp "$sdb" "$OUT/"
  finish
  ;;
host-time)
  log "host time of the torch op, layer by layer"
  export PYTHONPATH=$PWD/python FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ft-cache}
  PYTHONUNBUFFERED=1 python3 experiments/probes/host_time.py --csv "$rep/host_time.csv" "$@" 2>&1 |
    tee "$rep/host_time.txt" | tail -150
  cp "$rep/host_time.csv" "$rep/host_time.txt" "$OUT/"
  ;;
autotune-first-use)
  # Issue 36's first-use measurement (experiments/autotune_first_use.py): per bucket of the bf16 grid, the first
  # call tunes it (tables off, AUTOTUNE_BUDGET_S, default 60), a second process times the stored picks and the
  # committed table's, forward and backward. ~105 s a bucket at 60 s (the tune, its compiles, the timing): one GPU
  # takes ~4 buckets a call. AUTOTUNE_GPUS=N runs N parts side by side (one GPU each, its own store): on 8 GPUs
  # the 18 buckets fit one call. AUTOTUNE_OFFSET and AUTOTUNE_SUBSET: buckets OFFSET..OFFSET+SUBSET-1 (default all
  # 18). Each part paces itself to AUTOTUNE_CALL_S (default 570) less the build's time, and `timeout` stops it 30 s
  # later (its rows stay). AUTOTUNE_FAULT_CHECK=1 (default when OFFSET is 0): the first part first tunes a small
  # bucket through a CLI whose first sweep holds a faulting candidate (autotune_first_use_fault_check.json).
  export PYTHONPATH=$PWD/python FLASHTUNE_LIBRARY=$PWD/build/runtime/libflashtune_attention.so \
    FLASHTUNE_TORCH_LIBRARY=$PWD/build/python/csrc/libflashtune_torch.so FLASHTUNE_CLI=$PWD/build/flashtune
  gpus=${AUTOTUNE_GPUS:-1} offset=${AUTOTUNE_OFFSET:-0}
  subset=${AUTOTUNE_SUBSET:-$((18 - offset))}
  per=$(((subset + gpus - 1) / gpus))
  limit=$((${AUTOTUNE_CALL_S:-570} - ($(date +%s) - build_t0) - 30))
  name=autotune_first_use
  ((offset == 0 && subset >= 18)) || name=autotune_first_use_${offset}_$subset
  af_dir=$(mktemp -d)
  log "autotune at first use: buckets $offset..$((offset + subset - 1)) on $gpus GPU(s), budget ${AUTOTUNE_BUDGET_S:-60} s, paced to $limit s"
  pids=()
  for ((i = 0; i < gpus && offset + i * per < offset + subset; i++)); do
    o=$((offset + i * per)) n=$((subset - i * per))
    ((n > per)) && n=$per
    fault=()
    [[ $i == 0 && ${AUTOTUNE_FAULT_CHECK:-$((offset == 0))} == 1 ]] && fault=(--fault-check)
    CUDA_VISIBLE_DEVICES=$i timeout $((limit + 30)) python3 experiments/autotune_first_use.py --out "$af_dir/$i.csv" \
      --offset $o --subset $n --budget-s "${AUTOTUNE_BUDGET_S:-60}" --time-limit-s $limit "${fault[@]}" >"$af_dir/$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for log_file in "$af_dir"/*.log; do echo "-- part $(basename "$log_file" .log)"; cat "$log_file"; done >"$OUT/$name.log"
  { head -1 "$af_dir/0.csv"; for f in "$af_dir"/*.csv; do tail -n +2 "$f"; done; } >"$rep/$name.csv"
  grep -hE "^(fault check|autotune_first_use|tuned)|BAR|Error" "$OUT/$name.log" | tail -40
  cp "$rep/$name.csv" "$OUT/"
  [[ -f $af_dir/0_fault_check.json ]] && cp "$af_dir/0_fault_check.json" "$rep/${name}_fault_check.json" &&
    cp "$rep/${name}_fault_check.json" "$OUT/"
  rm -rf "$af_dir"
  ;;
torch-op)
  export PYTHONPATH=$PWD/python FLASHTUNE_LIBRARY=$PWD/build/runtime/libflashtune_attention.so \
    FLASHTUNE_TORCH_LIBRARY=$PWD/build/python/csrc/libflashtune_torch.so FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ft-cache} \
    FLASHTUNE_CLI=$PWD/build/flashtune  # first-use tuning runs the CLI: the build tree's (a wheel carries its own)
  ctest --test-dir build -R '^python_unit$' --output-on-failure >"$OUT/python_unit.log" 2>&1
  grep -E "tests passed|Failed|FAIL|Error|error:" "$OUT/python_unit.log" | head -20
  warm=()
  for shape in $([[ ${TORCH_OP_HOST_TIME:-1} == 1 ]] && echo 4,16,4096,128 16,16,1024,128); do  # the probe's kernels, compiled while the tests run
    python3 -c "import sys, torch; from flashtune.torch import attention; B,H,S,d = map(int, sys.argv[1].split(','))
q, k, v = (torch.randn(B, H, S, d, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
attention(q, k, v, causal=True).sum().backward(); torch.cuda.synchronize()" "$shape" >"$OUT/warm_${shape//,/x}.log" 2>&1 &
    warm+=($!)
  done
  log "gpu_torch_op ${*:-(all parts)}"
  PYTHONUNBUFFERED=1 timeout "${TORCH_OP_LIMIT_S:-900}" python3 tests/gpu_torch_op.py "$@" >"$OUT/gpu_torch_op.log" 2>&1
  echo "gpu_torch_op exit $?"; grep -E "^(FAIL|backend)|failure|all checks|Error" "$OUT/gpu_torch_op.log" | head -30
  wait "${warm[@]}"
  [[ ${TORCH_OP_HOST_TIME:-1} == 1 ]] || exit 0  # TORCH_OP_HOST_TIME=0: the tests alone
  log "host time"
  PYTHONUNBUFFERED=1 python3 experiments/probes/host_time.py --csv "$rep/host_time.csv" 2>&1 | tee "$rep/host_time.txt"
  cp "$rep/host_time.csv" "$rep/host_time.txt" "$OUT/"
  ;;
mods)
  # Issue 32's score modifications on Hopper, ALiBi first: random samples (16 per problem) of the mods spaces
  # validated on ragged ALiBi problems (forward dense and packed, backward dense) into alibi_validate.db, then
  # the cost of ALiBi at one long point (the same call with and without --alibi, each timed by run).
  val=$(validation_store alibi)
  for pair in "fa3_wgmma_mods ragged_alibi_bf16" "fa3_wgmma_mods ragged_alibi_varlen_bf16" \
              "fa3_wgmma_bwd_mods ragged_alibi_bwd_bf16"; do
    set -- $pair
    log "validate $1 on $2"
    timeout "${MODS_VALIDATE_LIMIT_S:-120}" $ft tune "configs/spaces/$1.json" "configs/problems/$2.json" --db "$val" \
      --strategy random --max-evals 16 --seed 3 --stop-margin 0.5 --retime 0 --timeout 5 2>&1 | grep -vE "^\[" | tail -2
  done
  validation_summary "$val"
  $ft drop-cubins --db "$val"
  for dir in fwd bwd; do
    shape=4,16,16384,16384,128; [[ $dir == bwd ]] && shape=4,16,8192,8192,128
    for extra in "" "--alibi"; do
      log "run $dir causal $shape $extra"
      params=BLOCK_N=128,CONSUMERS=2; [[ $dir == bwd ]] && params=BLOCK_M=64,CONSUMERS=2
      $ft run --family "$([[ $dir == fwd ]] && echo fa3_wgmma || echo fa3_wgmma_bwd)" --params $params --shape $shape --dtype bf16 \
        --causal --direction $dir $extra 2>&1 | grep -E "status|time|TFLOP|error" | head -3
    done
  done
  finish
  ;;
mods-mma)
  # Issue 32 on fa2_mma: every variant the problems need (their mods, dense or packed) compiled and validated on the
  # ragged forward shapes (windows 0, 1, a block, a block + 1, past the sequence; softcap 30 and 0.5; ALiBi alone and
  # with both; GQA, MQA, Sq != Sk both ways), no timing beyond validation.
  val=$(validation_store mma_mods)
  for problems in ragged_window_bf16 ragged_window_varlen_bf16 ragged_alibi_bf16 ragged_alibi_varlen_bf16; do
    log "validate fa2_mma_mods on $problems"
    timeout "${MODS_VALIDATE_LIMIT_S:-300}" $ft tune configs/spaces/fa2_mma_mods.json "configs/problems/$problems.json" \
      --db "$val" --retime 0 --stop-margin 0.5 2>&1 | grep -vE "^\[" | tail -2
  done
  # The backward (fa2_mma_bwd): windows of 0, 1, a block, a block + 1, past the sequence, softcap, ALiBi alone and
  # with both, GQA and MQA, Sq != Sk both ways; DQ_MODE 0 (atomics) and 1 (the deterministic pass) alike; dense and
  # packed (the *_varlen_bwd problems: the forwards' packed batches as backward problems).
  for problems in ragged_window_bwd_bf16 ragged_alibi_bwd_bf16 ragged_window_varlen_bwd_bf16 ragged_alibi_varlen_bwd_bf16; do
    log "validate fa2_mma_bwd_mods on $problems"
    timeout "${MODS_VALIDATE_LIMIT_S:-300}" $ft tune configs/spaces/fa2_mma_bwd_mods.json "configs/problems/$problems.json" \
      --db "$val" --retime 0 --stop-margin 0.5 2>&1 | grep -vE "^\[" | tail -2
  done
  validation_summary "$val"
  $ft drop-cubins --db "$val"
  finish
  ;;
variants-peers)
  log "variants beside the plain call, FlexAttention and FA3-class, one process, profiler kernel time"
  rm -f "$rep/variants_vs_peers.csv"
  # The compiles first, side by side: one process per head dim, sequence and direction calls every row once
  # (--warm), filling our JIT cache and Inductor's (FlexAttention) for the timed run, which then compiles nothing
  # of its own but FA3-class's per-shape kernels.
  warm=()
  for d in ${VARIANTS_DIMS:-64 128}; do for s in ${VARIANTS_SEQS:-4096 16384}; do for dir in fwd bwd; do
    # shellcheck disable=SC2086
    with_peers timeout "${VARIANTS_WARM_LIMIT_S:-300}" python3 experiments/variants_peers.py --out /dev/null --warm \
      --head-dims "$d" --seqs "$s" --directions "$dir" ${VARIANTS_ARGS:-} >"$OUT/warm_${d}_${s}_$dir.log" 2>&1 &
    warm+=($!)
  done; done; done
  wait "${warm[@]}"
  log "warm done"
  # shellcheck disable=SC2086
  with_peers timeout "${VARIANTS_LIMIT_S:-480}" python3 experiments/variants_peers.py --out "$rep/variants_vs_peers.csv" \
    --head-dims ${VARIANTS_DIMS:-64 128} --seqs ${VARIANTS_SEQS:-4096 16384} ${VARIANTS_ARGS:-} 2>"$OUT/variants_peers.log"
  echo "variants exit $?"; tail -5 "$OUT/variants_peers.log"
  cp "$rep/variants_vs_peers.csv" "$OUT/" 2>/dev/null
  ;;
train)
  export PYTHONPATH=$PWD/python FLASHTUNE_LIBRARY=$PWD/build/runtime/libflashtune_attention.so \
    FLASHTUNE_TORCH_LIBRARY=$PWD/build/python/csrc/libflashtune_torch.so FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ft-cache}
  for size in "" "--context 2048 --heads 8 --batch 8 --tag ctx2048"; do
    log "train_tiny_gpt $size"
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 python3 examples/train_tiny_gpt.py --profile "${1:-10}" --out-dir "$rep" $size 2>&1 | tee -a "$OUT/train.log" |
      grep -E "profiled|final loss|median|Error|error"
  done
  cp "$rep"/train_tiny_gpt*.csv "$rep"/train_tiny_gpt*.png "$OUT/"
  ;;
full-compile)
  # Every variant of every space through NVRTC for sm_80 and sm_90 (CI compiles a covering sample):
  # one CTest entry per space and arch, each compiling on every core.
  log "ctest nvrtc-full"
  ctest --preset nvrtc-full -V >"$OUT/ctest_nvrtc_full.log" 2>&1
  grep -E "Test +#|tests passed|FAIL|Failure|variants:" "$OUT/ctest_nvrtc_full.log" | tail -60
  ;;
final)
  # After a template change: every gpu test again, the stored best configs re-timed (a regression
  # shows as a drop against the stored figure), and the closest call against torch flash, three times.
  VALIDATE_DB=$OUT/validate.db ctest --preset gpu -V >"$OUT/ctest_gpu.log" 2>&1
  grep -E "Test +#|tests passed|FAIL|BAD|^[0-9]+: (naive|fa2_|fault) " "$OUT/ctest_gpu.log" | tail -20
  for spec in "fa2_simt 4,32,4096,4096,64 fp32 fwd" "fa2_simt 4,16,4096,4096,128 fp32 fwd" \
              "fa2_simt_bwd 4,16,4096,4096,128 fp32 bwd" "fa2_mma 4,16,4096,4096,128 bf16 fwd"; do
    set -- $spec
    $ft run --family $1 --best --db "$db" --shape $2 --dtype $3 --direction $4 | grep -E "^fa2|time"
  done
  for i in 1 2 3; do
    python3 experiments/tuned_vs_sdpa.py --db "$db" --problems configs/problems/spot_d256_s1k.json --out "$OUT/spot$i.csv" 2>/dev/null | tail -1
  done
  ;;
sweep-simt)
  tune naive anchors_fp32
  tune fa2_simt anchors_fp32
  compare fa2_simt anchors_fp32 efficient fa2_simt_vs_sdpa.csv
  $ft best --db "$db" --family naive --csv >"$rep/best_naive.csv"
  finish
  ;;
sweep-bwd)
  tune fa2_simt_bwd anchors_bwd_fp32
  compare fa2_simt_bwd anchors_bwd_fp32 efficient bwd_vs_sdpa_fp32.csv
  finish
  ;;
sweep-mma-bwd)
  tune fa2_mma_bwd anchors_bwd_bf16
  $ft best --db "$db" --family fa2_mma_bwd --csv >"$rep/best_fa2_mma_bwd.csv"
  finish
  ;;
sweep-mma-bwd-wide)  # the wide space at d 128/256, then the comparison re-timed
  tune fa2_mma_bwd_wide anchors_bwd_bf16
  ;&
compare-mma-bwd)
  log "backward comparison"
  python3 experiments/tuned_vs_sdpa.py --family fa2_mma_bwd --db "$db" --problems configs/problems/anchors_bwd_bf16.json --out "$rep/bwd_vs_sdpa.csv" 2>"$OUT/bwd_vs_sdpa.log"
  finish
  ;;
exp-wgmma)  # exp-wgmma BM,BN,SPLIT,STAGES,DQ_RED[,LOAD]:d ...: each config validated on ragged shapes, then timed on the grid's d points
  for spec in "$@"; do
    params=$(wgmma_params "${spec%:*}")
    d=${spec#*:}
    wgmma_ragged_checks "$params" "$d"
    for s in 1024 4096 16384; do
      for c in "" "--causal"; do
        $ft run --family fa2_wgmma_bwd --params "$params" --shape "$((16384 / s)),$((2048 / d)),$s,$s,$d" --dtype bf16 $c \
          --direction bwd 2>&1 | grep -E "TFLOP|status" | tr '\n' ' '; echo " <- $params d$d S$s $c"
      done
    done
  done | tee "$OUT/exp_wgmma.txt"
  ;;
profile-wgmma)  # profile-wgmma BM,BN,SPLIT,STAGES,DQ_RED[,LOAD] B,H,Sq,Sk,d: Nsight Compute on the dK/dV kernel (bf16, clocks untouched)
  ncu --clock-control none -k regex:fa2_wgmma_bwd_dkdv -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
    --section SourceCounters --import-source no \
    -o "$OUT/profile" $ft run --family fa2_wgmma_bwd --params "$(wgmma_params "$1")" \
    --shape "$2" --dtype bf16 --direction bwd >"$OUT/profile.log" 2>&1
  ncu --import "$OUT/profile.ncu-rep" --page details >"$OUT/profile.txt" 2>&1
  # per SASS instruction: executed counts and warp-stall samples (where the time goes inside the loop)
  ncu --import "$OUT/profile.ncu-rep" --page source --csv --print-source sass >"$OUT/profile_sass.csv" 2>&1
  gzip -f "$OUT/profile_sass.csv"
  grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|Pipe|L2|Shared|Bank|No Eligible|One or More" "$OUT/profile.txt" | head -60
  ;;
error-wgmma)  # identical-input error vs torch flash of the tuned fa2_wgmma_bwd (d 128, 256; --best from the DB)
  wgmma_error
  cp "$rep/bwd_error_vs_torch_wgmma.csv" "$OUT/"
  ;;
refresh-wgmma-d256)  # identical-input error vs torch flash (d 128, 256); DQ_RED 2 configs stored at the d = 256 points,
                     # then the best per d = 256 point re-timed beside torch flash and cuDNN (bwd_vs_sdpa_d256.csv)
  log "error vs torch flash, identical inputs"
  wgmma_error
  log "DQ_RED 2 at d = 256"
  for cfg in 64,64,2,2,2 64,64,2,1,2; do
    for s in 1024 4096 16384; do
      for c in "" "--causal"; do
        $ft run --family fa2_wgmma_bwd --params "$(wgmma_params "$cfg")" --db "$db" \
          --shape "$((16384 / s)),8,$s,$s,256" --dtype bf16 $c --direction bwd 2>&1 | grep -E "TFLOP" | tr '\n' ' '
        echo " <- $cfg S$s $c"
      done
    done
  done
  log "d = 256 comparison"
  python3 experiments/tuned_vs_sdpa.py --family fa2_wgmma_bwd,fa2_mma_bwd --db "$db" --problems configs/problems/anchors_bwd_bf16_d256.json \
    --out "$rep/bwd_vs_sdpa_d256.csv" 2>"$OUT/bwd_vs_sdpa_d256.log"
  cut -d, -f2-20 "$rep/bwd_vs_sdpa_d256.csv"
  finish
  ;;
check-wgmma)  # a few fa2_wgmma_bwd configs validated on ragged shapes, then timed at S = 4096; "all": then sweep-wgmma-bwd
  then=${1:-}
  for spec in "64,128,0,2,0 64" "64,64,2,2,0 256" "64,64,2,1,1 256" "64,128,0,2,1 128" "64,64,2,2,1 128" \
              "64,64,2,2,1 32" "64,64,2,2,1 96" "64,64,2,1,1 192" "64,64,1,1,0 64"; do
    set -- $spec
    wgmma_ragged_checks "$(wgmma_params "$1")" "$2"
  done
  for spec in "64,128,0,2,0 4,32,4096,4096,64" "64,128,0,2,0 4,16,4096,4096,128" "64,128,0,2,1 4,16,4096,4096,128" \
              "64,64,2,2,0 4,16,4096,4096,128" "64,64,2,2,0 4,8,4096,4096,256" "64,64,2,1,1 4,8,4096,4096,256"; do
    set -- $spec
    for c in "" "--causal"; do
      $ft run --family fa2_wgmma_bwd --params "$(wgmma_params "$1")" --shape "$2" --dtype bf16 \
        $c --direction bwd 2>&1 | grep -E "TFLOP|time|status" | tr '\n' ' '; echo " <- $1 $2 $c"
    done
  done | tee "$OUT/check_timing.txt"
  [[ $then == all ]] || exit 0
  ;&
sweep-wgmma-bwd)  # tune fa2_wgmma_bwd on the grid's d 128/256 points, then the best of both bf16 backward families beside torch
  tune fa2_wgmma_bwd_grid anchors_bwd_bf16_d128_256
  $ft best --db "$db" --family fa2_wgmma_bwd --csv >"$rep/best_fa2_wgmma_bwd.csv"
  finish  # packed now too: the comparison below may be cut by the time limit
  log "backward comparison"
  python3 experiments/tuned_vs_sdpa.py --family fa2_wgmma_bwd,fa2_mma_bwd --db "$db" --problems configs/problems/anchors_bwd_bf16.json --out "$rep/bwd_vs_sdpa.csv" 2>"$OUT/bwd_vs_sdpa.log"
  cat "$rep/bwd_vs_sdpa.csv" | cut -d, -f2-20 | head -3
  finish
  ;;
sweep-mma)
  tune fa2_mma anchors_bf16
  $ft best --db "$db" --family fa2_mma --csv >"$rep/best_fa2_mma.csv"
  finish
  ;;
compare-mma)
  log "forward comparison"
  python3 experiments/tuned_vs_sdpa.py --db "$db" --problems configs/problems/anchors_bf16.json --out "$rep/fwd_vs_sdpa.csv" 2>"$OUT/fwd_vs_sdpa.log"
  log "tolerance probe"
  python3 experiments/tolerance_probe.py --out "$rep/tolerance_probe.csv" >"$OUT/probe.log" 2>&1
  finish
  ;;
esac
log done
