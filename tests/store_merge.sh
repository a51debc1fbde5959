#!/usr/bin/env bash
# flashtune merge on real stores (the committed ones, copied, never changed) and the fixture: rows and
# provenance, merging twice changes nothing, a merge of merges names its shards, older schemas read
# as they are, and the refusals (exit 2, one line, the output's sha256 unchanged or no file created).
set -u
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
F=$FLASHTUNE
sql() { python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); r = c.execute(sys.argv[2]).fetchall(); c.commit(); print("\n".join("|".join(map(str, x)) for x in r))' "$@"; }
check() { [[ "$2" == "$3" ]] || { echo "FAIL: $1: got '$2', want '$3'"; fail=1; }; }
refused() {  # refused "<needle>" OUTPUT args...: exit 2, one line with the needle, OUTPUT unchanged (or absent)
  local needle=$1 out=$2; shift 2
  local before after
  before=$(sha256sum "$out" 2>/dev/null)
  "$F" merge "$@" >"$tmp/stdout" 2>"$tmp/err"
  local rc=$?
  after=$(sha256sum "$out" 2>/dev/null)
  if [[ $rc -ne 2 || $(wc -l <"$tmp/err") -ne 1 ]] || ! grep -q -F -- "$needle" "$tmp/err"; then
    echo "FAIL: merge $* -> rc=$rc, want 2 and one line with '$needle':"; cat "$tmp/err"; fail=1
  fi
  [[ "$before" == "$after" ]] || { echo "FAIL: merge $*: the output changed"; fail=1; }
}

"$FIXTURE_TOOL" "$tmp/fixture.db" || exit 1
committed=()
for db in "$SRC"/reports/*/results.db; do
  [[ -f "$db" ]] || continue
  cp "$db" "$tmp/$(basename "$(dirname "$db")").db"
  committed+=("$tmp/$(basename "$(dirname "$db")").db")
done
committed_sums=$(sha256sum "$SRC"/reports/*/results.db 2>/dev/null)
inputs=("$tmp/fixture.db" "${committed[@]}")
input_sums=$(sha256sum "${inputs[@]}")

# --- every row arrives once, with its provenance ---------------------------------------------
start=$SECONDS
"$F" merge "${inputs[@]}" -o "$tmp/all.db" >"$tmp/merge.out" || { echo "FAIL: merge"; cat "$tmp/merge.out"; exit 1; }
echo "merge of ${#inputs[@]} stores: $((SECONDS - start)) s"
want_results=0 want_kernels=0 want_runs=0
for db in "${inputs[@]}"; do
  want_results=$((want_results + $(sql "$db" "select count(*) from results")))
  want_kernels=$((want_kernels + $(sql "$db" "select count(*) from kernels")))
  want_runs=$((want_runs + $(sql "$db" "select count(*) from experiment_runs")))
done
check "results" "$(sql "$tmp/all.db" "select count(*) from results")" "$want_results"
check "kernels" "$(sql "$tmp/all.db" "select count(*) from kernels")" "$want_kernels"
check "experiment runs" "$(sql "$tmp/all.db" "select count(*) from experiment_runs")" "$want_runs"
check "schema" "$(sql "$tmp/all.db" "select value from meta")" 11
check "provenance" "$(sql "$tmp/all.db" "select count(*), count(distinct content_hash), sum(results) from provenance where kind='merge'")" \
  "${#inputs[@]}|${#inputs[@]}|$want_results"
check "provenance names the input" "$(sql "$tmp/all.db" "select source from provenance where id=1")" "$tmp/fixture.db"
check "every row has its origin" "$(sql "$tmp/all.db" "select count(*) from results where origin is null or origin not in (select id from provenance)")" 0
check "inputs unchanged" "$(sha256sum "${inputs[@]}")" "$input_sums"
# The rows themselves: the fixture's H100 results, exported, are the merged store's for that device
# (merged with the committed stores of other devices: a committed H100 store would add its own rows).
fixture_device="NVIDIA H100 80GB HBM3"
others=()
for db in "${committed[@]}"; do
  [[ $(sql "$db" "select count(*) from results where device_name='$fixture_device'") -eq 0 ]] && others+=("$db")
done
"$F" merge "$tmp/fixture.db" "${others[@]}" -o "$tmp/fx.db" >/dev/null || { echo "FAIL: merge with the other devices"; fail=1; }
"$F" export --db "$tmp/fixture.db" --device "$fixture_device" -o "$tmp/a.json"
"$F" export --db "$tmp/fx.db" --device "$fixture_device" -o "$tmp/b.json"
cmp -s "$tmp/a.json" "$tmp/b.json" || { echo "FAIL: the merged H100 rows differ from the fixture's"; fail=1; }
check "best over the merged store" "$("$F" best --db "$tmp/fx.db" --device "$fixture_device" --csv)" \
  "$("$F" best --db "$tmp/fixture.db" --device "$fixture_device" --csv)"

# --- merging again changes nothing ------------------------------------------------------------
sum=$(sha256sum <"$tmp/all.db")
"$F" merge "${inputs[@]}" -o "$tmp/all.db" >"$tmp/again.out" || { echo "FAIL: merge again"; fail=1; }
check "second merge says so" "$(grep -c "already merged" "$tmp/again.out")" "${#inputs[@]}"
check "second merge leaves the file" "$(sha256sum <"$tmp/all.db")" "$sum"
# The same input twice in one call: once.
"$F" merge "$tmp/fixture.db" "$tmp/fixture.db" -o "$tmp/twice.db" >/dev/null || { echo "FAIL: same input twice"; fail=1; }
check "same input twice" "$(sql "$tmp/twice.db" "select count(*) from provenance")|$(sql "$tmp/twice.db" "select count(*) from results")" \
  "1|$(sql "$tmp/fixture.db" "select count(*) from results")"

# --- a row whose key is stored with other values is kept as stored, and counted ----------------
cp "$tmp/fixture.db" "$tmp/changed.db"
sql "$tmp/changed.db" "update results set ms_median = ms_median * 2 where status = 'ok'" >/dev/null
sql "$tmp/changed.db" "insert into results(kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,status,
  device_name,arch,sm_count,driver_version,nvrtc_version,options,source_hash,created,inputs)
  values('h-new','fa2_simt','fwd','BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2',1,1,128,128,64,'fp32',0,'crashed',
  'NVIDIA H200','sm_90',132,13000,'13.0','','','2026-11-28T00:00:00Z','normal')" >/dev/null
"$F" merge "$tmp/changed.db" -o "$tmp/twice.db" >"$tmp/changed.out" || { echo "FAIL: merge of a changed copy"; fail=1; }
grep -q "+1 results.*kept as stored though the input's values differ" "$tmp/changed.out" ||
  { echo "FAIL: changed rows not reported: $(cat "$tmp/changed.out")"; fail=1; }
check "stored values kept" "$(sql "$tmp/twice.db" "select sum(ms_median) from results")" \
  "$(sql "$tmp/fixture.db" "select sum(ms_median) from results")"

# --- a merge of merges keeps the shards' provenance -------------------------------------------
"$F" merge "$tmp/twice.db" -o "$tmp/top.db" >/dev/null || { echo "FAIL: merge of a merge"; fail=1; }
python3 - "$tmp/top.db" "$tmp/fixture.db" "$tmp/changed.db" <<'PY' || fail=1
import json, sqlite3, sys
up = json.loads(sqlite3.connect(sys.argv[1]).execute("select upstream from provenance").fetchone()[0])
if [u["source"] for u in up] != sys.argv[2:4]:
    print("FAIL: upstream provenance", up); sys.exit(1)
PY

# --- older schemas: inputs read as they are, an older output migrated -------------------------
cp "$tmp/fixture.db" "$tmp/v3.db"
python3 "$SRC/tests/make_v3_store.py" "$tmp/v3.db"
v3_sum=$(sha256sum <"$tmp/v3.db")
"$F" merge "$tmp/v3.db" -o "$tmp/from_v3.db" >/dev/null || { echo "FAIL: merge of a v3 store"; fail=1; }
check "v3 input unchanged" "$(sha256sum <"$tmp/v3.db")" "$v3_sum"
check "v3 rows" "$(sql "$tmp/from_v3.db" "select count(*), min(inputs) from results")" "8|normal"
cp "$tmp/v3.db" "$tmp/v3_out.db"
"$F" merge "${committed[@]:-$tmp/fixture.db}" -o "$tmp/v3_out.db" >/dev/null || { echo "FAIL: merge into a v3 store"; fail=1; }
check "v3 output migrated" "$(sql "$tmp/v3_out.db" "select value from meta"),$(sql "$tmp/v3_out.db" "pragma application_id")" "11,1181504622"

# --- refusals -----------------------------------------------------------------------------------
cp "$tmp/fixture.db" "$tmp/out.db"
cp "$tmp/fixture.db" "$tmp/sm.db"
sql "$tmp/sm.db" "update results set sm_count = 114 where device_name = 'NVIDIA H200'" >/dev/null
refused "device 'NVIDIA H200' is sm_90, 132 SMs, driver 13000 in '$tmp/out.db' but sm_90, 114 SMs" "$tmp/out.db" "$tmp/sm.db" -o "$tmp/out.db"
cp "$tmp/fixture.db" "$tmp/drv.db"
sql "$tmp/drv.db" "update results set driver_version = 13010" >/dev/null
refused "driver 13010 in '$tmp/drv.db'" "$tmp/out.db" "$tmp/drv.db" -o "$tmp/out.db"
refused "driver 13010 in '$tmp/drv.db'" "$tmp/new.db" "$tmp/fixture.db" "$tmp/drv.db" -o "$tmp/new.db"
[[ -e "$tmp/new.db" ]] && { echo "FAIL: a refused merge created its output"; fail=1; }
cp "$tmp/fixture.db" "$tmp/arch.db"
sql "$tmp/arch.db" "update results set arch = 'sm_100' where device_name = 'NVIDIA H200'" >/dev/null
refused "but sm_100, 132 SMs" "$tmp/out.db" "$tmp/arch.db" -o "$tmp/out.db"
cp "$tmp/fixture.db" "$tmp/newer.db"
sql "$tmp/newer.db" "update meta set value = '12'" >/dev/null
refused "has schema version '12', this flashtune reads versions 1..11" "$tmp/out.db" "$tmp/newer.db" -o "$tmp/out.db"
sql "$tmp/foreign.db" "create table accounts(id integer primary key)" >/dev/null
refused "is not a flashtune database" "$tmp/out.db" "$tmp/foreign.db" -o "$tmp/out.db"
refused "is not a flashtune database" "$tmp/foreign.db" "$tmp/fixture.db" -o "$tmp/foreign.db"
refused "does not exist" "$tmp/out.db" "$tmp/missing.db" -o "$tmp/out.db"
refused "is the output too" "$tmp/out.db" "$tmp/fixture.db" "$tmp/out.db" -o "$tmp/out.db"

check "committed stores unchanged" "$(sha256sum "$SRC"/reports/*/results.db 2>/dev/null)" "$committed_sums"
[[ $fail -eq 0 ]] && echo "store_merge: all passed"
exit $fail
