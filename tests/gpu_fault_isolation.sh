#!/usr/bin/env bash
# On a GPU: a sweep whose candidates write out of bounds (MODE=1) and never end (MODE=2) records
# them as crashed and timeout, restarts the worker, and goes on to validate MODE=0. A rerun skips.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/problems.json" <<'JSON'
{"problems": [{"batch": 1, "heads": 2, "seq_q": 100, "seq_k": 130, "head_dim": 32},
              {"batch": 1, "heads": 2, "seq_q": 130, "seq_k": 100, "head_dim": 32, "causal": true}]}
JSON
"$FLASHTUNE" tune "$SRC/configs/spaces/fault.json" "$tmp/problems.json" --db "$tmp/f.db" --timeout 5 --quiet \
  >"$tmp/out" 2>&1 || { echo "FAIL: tune exited non-zero"; cat "$tmp/out"; exit 1; }
cat "$tmp/out"
python3 - "$tmp/f.db" <<'PY' || exit 1
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select config, causal, status, error from results order by id").fetchall()
want = {"MODE=1": "crashed", "MODE=2": "timeout", "MODE=0": "ok"}
bad = [r for r in rows if want[r[0]] != r[2]]
for r in rows: print(r)
if len(rows) != 6 or bad:
    sys.exit(f"FAIL: want 6 rows with statuses {want}, got {len(rows)} rows, mismatches {bad}")
PY
"$FLASHTUNE" tune "$SRC/configs/spaces/fault.json" "$tmp/problems.json" --db "$tmp/f.db" --timeout 5 --quiet \
  >"$tmp/out2" 2>&1
grep -q "6 already stored" "$tmp/out2" || { echo "FAIL: rerun did not skip stored candidates"; cat "$tmp/out2"; exit 1; }
echo "gpu_fault_isolation: passed"
