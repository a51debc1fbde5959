#!/usr/bin/env bash
# On a GPU: several `tune` processes started together on one new store all finish (no "database is
# locked"), every (candidate, problem) is stored exactly once, and each process skips what another
# stored; then a sweep killed with SIGKILL mid-way resumes with nothing lost or doubled.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cat >"$tmp/space.json" <<'JSON'
{"family": "fa2_simt", "params": {"BLOCK_M": [32, 64], "BLOCK_N": [32, 64], "TM": [4], "TN": [4], "KV_STAGES": [1, 2]},
 "head_dims": [64], "causal": [false, true], "dtypes": ["fp32"]}
JSON
cat >"$tmp/problems.json" <<'JSON'
{"problems": [{"batch": 1, "heads": 2, "seq_q": 200, "seq_k": 333, "head_dim": 64},
              {"batch": 2, "heads": 1, "seq_q": 333, "seq_k": 200, "head_dim": 64, "causal": true},
              {"batch": 1, "heads": 2, "seq_q": 257, "seq_k": 257, "head_dim": 64, "inputs": {"scale": 30}}]}
JSON
# 8 configs x 3 problems (each problem matches one mask): 24 (candidate, problem) pairs.
want=24

count_rows() {  # count_rows DB -> "rows distinct_keys not_ok"
  python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = c.execute("select count(*) from results").fetchone()[0]
keys = c.execute("select count(*) from (select distinct kernel_hash, batch, heads, seq_q, seq_k, inputs from results)").fetchone()[0]
bad = c.execute("select count(*) from results where status not in ('ok', 'pruned')").fetchone()[0]
print(rows, keys, bad)
PY
}

# 1. Four writers on one new store.
pids=()
for i in 1 2 3 4; do
  "$FLASHTUNE" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/c.db" --quiet >"$tmp/out$i" 2>&1 &
  pids+=($!)
done
for i in 1 2 3 4; do
  wait "${pids[$((i - 1))]}" || { echo "FAIL: concurrent tune $i exited non-zero"; cat "$tmp/out$i"; fail=1; }
done
read -r rows keys bad < <(count_rows "$tmp/c.db")
echo "concurrent: $rows rows, $keys distinct, $bad neither ok nor pruned"; cat "$tmp"/out?
[[ $rows -eq $want && $keys -eq $want && $bad -eq 0 ]] || { echo "FAIL: want $want rows, all ok or pruned"; fail=1; }
skipped=$(cat "$tmp"/out? | grep -o '[0-9]* already stored' | awk '{s += $1} END {print s + 0}')
[[ $skipped -gt 0 ]] || { echo "FAIL: no writer skipped what another stored"; fail=1; }

# 2. kill -9 mid-sweep, then resume: complete, nothing doubled. Shapes large enough (~0.5 s a
#    candidate) that the kill lands inside the sweep.
cat >"$tmp/large.json" <<'JSON'
{"problems": [{"batch": 4, "heads": 16, "seq_q": 2048, "seq_k": 2000, "head_dim": 64},
              {"batch": 4, "heads": 16, "seq_q": 2000, "seq_k": 2048, "head_dim": 64, "causal": true},
              {"batch": 4, "heads": 16, "seq": 2048, "head_dim": 64, "inputs": {"distribution": "heavy"}}]}
JSON
"$FLASHTUNE" tune "$tmp/space.json" "$tmp/large.json" --db "$tmp/k.db" --quiet >"$tmp/kill1" 2>&1 &
pid=$!
for _ in $(seq 600); do  # until a few results are stored
  sleep 0.1
  [[ -f "$tmp/k.db" ]] && n=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from results').fetchone()[0])" "$tmp/k.db" 2>/dev/null) && [[ ${n:-0} -ge 3 ]] && break
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
read -r rows_killed _ _ < <(count_rows "$tmp/k.db")
"$FLASHTUNE" tune "$tmp/space.json" "$tmp/large.json" --db "$tmp/k.db" --quiet >"$tmp/kill2" 2>&1 ||
  { echo "FAIL: resumed tune exited non-zero"; cat "$tmp/kill2"; fail=1; }
read -r rows keys bad < <(count_rows "$tmp/k.db")
echo "kill -9 after $rows_killed rows; resumed: $rows rows, $keys distinct, $bad neither ok nor pruned"; cat "$tmp/kill2"
[[ $rows_killed -ge 1 && $rows_killed -lt $want ]] || { echo "FAIL: the kill did not land inside the sweep"; fail=1; }
[[ $rows -eq $want && $keys -eq $want && $bad -eq 0 ]] || { echo "FAIL: want $want rows after the resume"; fail=1; }
[[ $fail -eq 0 ]] && echo "gpu_concurrent_tune: passed"
exit $fail
