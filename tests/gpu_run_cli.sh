#!/usr/bin/env bash
# On a GPU: `flashtune run` validates every row with --check and reports JSON; a faulting kernel
# is a reported status and exit code 1, not a hang or a crash of flashtune.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$FLASHTUNE" run --family fa2_simt --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2 --shape 2,3,333,517,64 \
  --causal --check --json >"$tmp/ok.json" || { echo "FAIL: fa2_simt run"; cat "$tmp/ok.json"; fail=1; }
python3 - "$tmp/ok.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print(r)
assert r["status"] == "ok" and r["ms_median"] > 0 and r["tflops"] > 0 and 0 < r["max_abs"] < 1e-4, r
PY
"$FLASHTUNE" run --family fault --params MODE=1 --shape 1,1,64,64,32 --json >"$tmp/crash.json"
rc=$?
grep -q '"status": "crashed"' "$tmp/crash.json" && [[ $rc -eq 1 ]] || { echo "FAIL: crash not reported (rc=$rc)"; cat "$tmp/crash.json"; fail=1; }
"$FLASHTUNE" run --family fault --params MODE=2 --shape 1,1,64,64,32 --timeout 3 --json >"$tmp/hang.json"
rc=$?
grep -q '"status": "timeout"' "$tmp/hang.json" && [[ $rc -eq 1 ]] || { echo "FAIL: hang not reported (rc=$rc)"; cat "$tmp/hang.json"; fail=1; }
# Backward: DQ_MODE=1 is bitwise deterministic; every gradient within fp32's bound.
"$FLASHTUNE" run --family fa2_simt_bwd --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=2,DQ_MODE=1 --shape 2,2,333,517,64 \
  --causal --check-determinism --json >"$tmp/bwd.json" || { echo "FAIL: bwd run"; cat "$tmp/bwd.json"; fail=1; }
python3 - "$tmp/bwd.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print(r)
d = r["detail"]
assert r["status"] == "ok" and d["deterministic"] is True, r
assert all(d[g + "_rel_l2"] <= 1e-5 for g in ("dq", "dk", "dv")), d
PY
"$FLASHTUNE" run --family fa2_mma_bwd --params BLOCK_M=32,BLOCK_N=128,WARPS=4,DSPLIT=1,STAGES=2,DQ_MODE=1 \
  --shape 2,2,517,333,64 --dtype bf16 --causal --direction bwd --check-determinism --json >"$tmp/mbwd.json" \
  || { echo "FAIL: fa2_mma_bwd run"; cat "$tmp/mbwd.json"; fail=1; }
python3 - "$tmp/mbwd.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print(r)
d = r["detail"]
assert r["status"] == "ok" and d["deterministic"] is True, r
assert all(d[g + "_rel_l2"] <= 2e-2 for g in ("dq", "dk", "dv")), d
PY
[[ $fail -eq 0 ]] && echo "gpu_run_cli: passed"
exit $fail
