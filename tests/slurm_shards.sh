#!/usr/bin/env bash
# scripts/slurm/: a sweep tuned in shards and merged gives the store one run gives (the same kernels
# table rows; compile-only, sm_80, the naive family, 8 problems).
#   slurm_shards.sh direct   each array task's command line and the merge job's, run here as Slurm
#                            would run them (SLURM_ARRAY_TASK_* set), plus the scripts' refusals
#   slurm_shards.sh cluster  a single-node Slurm (munged, slurmctld, slurmd from Debian's slurm-wlm,
#                            private config, ports, state and socket under a temporary folder) to
#                            which scripts/slurm/submit.sh submits the array and the dependent merge.
#                            It needs root (slurmd starts jobs as their user) and the packages that
#                            scripts/setup.sh installs; without them it fails and says so.
# Until `tune` has --shard K/N, a stand-in flashtune turns it into the problems K, K+N, ... of the
# problems file (the test splits it): the scripts run as they will, the candidates' split differs.
set -u
mode=${1:?usage: slurm_shards.sh direct|cluster}
fail=0
tmp=$(mktemp -d)
cleanup() {
  [[ -n ${SLURM_CONF:-} ]] && scancel --quiet --user="$(id -un)" 2>/dev/null
  for f in "$tmp"/slurmd.pid "$tmp"/slurmctld.pid "$tmp"/munge/munged.pid; do
    [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 0.5
  rm -rf "$tmp"
}
trap cleanup EXIT
S=$SRC/scripts/slurm
sql() { python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); print("\n".join("|".join(map(str, x)) for x in c.execute(sys.argv[2])))' "$@"; }

# Eight problems, every head dim, causal or not; and their split for the --shard stand-in.
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
ps = [{"batch": 1, "heads": 2, "seq": 64, "head_dim": d, "causal": c} for d in (32, 64, 96, 128) for c in (False, True)]
json.dump({"problems": ps}, open(f"{t}/problems.json", "w"))
for k in range(2):
    json.dump({"problems": ps[k::2]}, open(f"{t}/problems.json.shard_{k}", "w"))
PY
ft=$FLASHTUNE
if ! "$FLASHTUNE" tune --help | grep -q -- "--shard"; then
  ft=$tmp/flashtune
  cat >"$ft" <<EOF
#!/usr/bin/env bash
# tune SPACE PROBLEMS --shard K/N ... -> tune SPACE PROBLEMS.shard_K ... (made by the test); else as is
args=()
while ((\$#)); do
  if [[ \$1 == --shard ]]; then k=\${2%%/*}; shift 2; continue; fi
  args+=("\$1"); shift
done
[[ -n \${k:-} ]] && args[2]=\${args[2]}.shard_\$k
exec "$FLASHTUNE" "\${args[@]}"
EOF
  chmod +x "$ft"
fi
"$FLASHTUNE" tune "$SRC/configs/spaces/naive.json" "$tmp/problems.json" --db "$tmp/one.db" --arch sm_80 --quiet >/dev/null 2>&1 ||
  { echo "FAIL: the single tune"; exit 1; }
out=$tmp/out
mkdir -p "$out"

if [[ $mode == direct ]]; then
  for k in 0 1; do  # what Slurm runs for task k of --array=0-1
    SLURM_ARRAY_TASK_ID=$k SLURM_ARRAY_TASK_COUNT=2 SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=1 \
      bash "$S/tune_shard.sbatch" "$ft" "$SRC/configs/spaces/naive.json" "$tmp/problems.json" "$out" --arch sm_80 \
      >"$out/shard_$k.log" 2>&1 || { echo "FAIL: shard $k: $(tail -3 "$out/shard_$k.log")"; fail=1; }
  done
  bash "$S/merge_shards.sbatch" "$ft" "$out" 2 >"$out/merge.log" 2>&1 || { echo "FAIL: merge job: $(tail -3 "$out/merge.log")"; fail=1; }
  # The scripts' own refusals: an array that is not 0..N-1, a missing shard, no array at all.
  SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=2 SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_MAX=2 \
    bash "$S/tune_shard.sbatch" "$ft" x y "$out" >/dev/null 2>"$tmp/err"
  [[ $? -eq 2 ]] && grep -q "the array must be 0-1" "$tmp/err" || { echo "FAIL: an array from 1 accepted"; fail=1; }
  (unset SLURM_ARRAY_TASK_ID; bash "$S/tune_shard.sbatch" "$ft" x y "$out" >/dev/null 2>&1) && { echo "FAIL: no array task id accepted"; fail=1; }
  bash "$S/merge_shards.sbatch" "$ft" "$out" 3 >/dev/null 2>"$tmp/err"
  [[ $? -ne 0 ]] && grep -q "shard_2.db is missing" "$tmp/err" || { echo "FAIL: a missing shard not reported"; fail=1; }
  bash "$S/submit.sh" --shards 0 "$SRC/configs/spaces/naive.json" "$tmp/problems.json" "$out" >/dev/null 2>"$tmp/err"
  [[ $? -eq 2 ]] && grep -q -- "--shards must be an integer in 1..1000" "$tmp/err" || { echo "FAIL: submit.sh --shards 0"; fail=1; }
elif [[ $mode == cluster ]]; then
  missing=()
  for c in munged mungekey slurmctld slurmd sbatch squeue scancel sinfo; do command -v $c >/dev/null || missing+=($c); done
  if ((${#missing[@]})); then
    echo "FAIL: Slurm is not installed (missing: ${missing[*]}); scripts/setup.sh installs slurmctld slurmd slurm-client munge"
    exit 1
  fi
  [[ $(id -u) -eq 0 ]] || { echo "FAIL: slurm_shards.sh cluster needs root to start slurmd (it launches jobs as their user)"; exit 1; }
  port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  node=$(hostname -s)
  mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" && chmod 700 "$tmp/munge"
  mungekey --create --keyfile="$tmp/munge/munge.key" && chmod 600 "$tmp/munge/munge.key"
  munged -f --socket="$tmp/munge/sock" --key-file="$tmp/munge/munge.key" --log-file="$tmp/munged.log" \
    --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/seed" || { echo "FAIL: munged: $(tail -2 "$tmp/munged.log")"; exit 1; }
  cat >"$tmp/slurm.conf" <<EOF
ClusterName=fttest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$tmp/slurm.conf
  slurmctld -f "$SLURM_CONF" -i || { echo "FAIL: slurmctld: $(tail -3 "$tmp/slurmctld.log")"; exit 1; }
  slurmd -f "$SLURM_CONF" || { echo "FAIL: slurmd: $(tail -3 "$tmp/slurmd.log")"; exit 1; }
  for _ in $(seq 60); do [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && break; sleep 0.5; done
  [[ $(sinfo -h -o %t) == idle ]] || { echo "FAIL: the node is not idle: $(sinfo -h 2>&1) $(tail -3 "$tmp/slurmd.log")"; exit 1; }
  start=$SECONDS
  bash "$S/submit.sh" --shards 2 --gpus 0 --flashtune "$ft" "$SRC/configs/spaces/naive.json" "$tmp/problems.json" "$out" \
    -- --arch sm_80 >"$tmp/submit.out" 2>&1 || { echo "FAIL: submit.sh: $(cat "$tmp/submit.out")"; exit 1; }
  for _ in $(seq 240); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
  [[ -z $(squeue -h) ]] || { echo "FAIL: jobs still queued after 120 s: $(squeue -h)"; fail=1; }
  echo "$(cat "$tmp/submit.out"); finished in $((SECONDS - start)) s"
  for f in shard_0.log shard_1.log merge.log; do
    [[ -f $out/$f ]] || { echo "FAIL: no $f (slurmctld: $(tail -2 "$tmp/slurmctld.log"))"; fail=1; }
  done
else
  echo "usage: slurm_shards.sh direct|cluster"; exit 2
fi

# The merged shards hold the single run's kernels, row for row: compile times and dates aside, and
# the binaries by size (NVRTC's bytes differ from one compile of the same source to the next).
kernels() {
  sql "$1" "select hash, family, direction, config, head_dim, causal, dtype, arch, nvrtc_version, options, source_hash,
    name_expression, status, reason, lowered_name, registers, smem_static, stack_bytes, spill_stores, spill_loads,
    length(cubin) from kernels order by hash"
}
if [[ ! -f $out/all.db ]]; then
  echo "FAIL: no merged store: $(tail -3 "$out/merge.log" 2>/dev/null)"; fail=1
else
  [[ "$(kernels "$out/all.db")" == "$(kernels "$tmp/one.db")" ]] ||
    { echo "FAIL: merged kernels differ from one run's:"; diff <(kernels "$out/all.db") <(kernels "$tmp/one.db") | head -5; fail=1; }
  n=$(sql "$tmp/one.db" "select count(*) from kernels")
  [[ $n -ge 8 ]] || { echo "FAIL: the single run compiled only $n kernels"; fail=1; }
  [[ "$(sql "$out/all.db" "select count(*) from results")" == "$(sql "$tmp/one.db" "select count(*) from results")" ]] ||
    { echo "FAIL: merged results differ in number"; fail=1; }
  [[ "$(sql "$out/all.db" "select group_concat(source, ' ') from provenance")" == "$out/shard_0.db $out/shard_1.db" ]] ||
    { echo "FAIL: provenance: $(sql "$out/all.db" "select * from provenance")"; fail=1; }
  sum=$(sha256sum <"$out/all.db")
  "$FLASHTUNE" merge "$out/shard_0.db" "$out/shard_1.db" -o "$out/all.db" >/dev/null
  [[ "$(sha256sum <"$out/all.db")" == "$sum" ]] || { echo "FAIL: the merge job run again changed all.db"; fail=1; }
  echo "$mode: 2 shards, $n kernels merged, as one run"
fi
[[ $fail -eq 0 ]] && echo "slurm_shards $mode: all passed"
exit $fail
