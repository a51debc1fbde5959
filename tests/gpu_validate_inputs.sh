#!/usr/bin/env bash
# On a GPU: validation keeps right kernels and throws away wrong ones on inputs that are not unit normal
# (worker/validate.hpp, issue 12).
#  (a) every non-test family (from `flashtune families --json`), with
#      its default config, on each dtype it supports, d = 64 (or its first head dim), causal and not:
#      Sk = 1 (B,H,Sq,Sk = 1,1,1,1 and 1,1,4096,1 causal), normal x30 and heavy-tailed (Student-t, x3)
#      on a ragged 1,2,200,333: every candidate must be `ok` (hopper-only families off sm_90 are
#      `pruned` with the sm_90a reason and not counted).
#  (b) configs/spaces/fault_wrong.json: MODE 0 `ok`, MODE 3 (skips one K/V block) and MODE 4 (one row
#      moved by 5% of its magnitude) `invalid`, in fp32, fp16 and bf16, on normal and x30 inputs.
# The checker counts the rows it expects from the problem files, so it cannot pass on an empty sweep.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

"$FLASHTUNE" families --json >"$tmp/families.json" || { echo "FAIL: flashtune families --json"; exit 1; }

# One space (the family's default config) and one problem file per family.
python3 - "$tmp" <<'PY' || exit 1
import json, os, sys
tmp = sys.argv[1]
fams = [f for f in json.load(open(os.path.join(tmp, "families.json"))) if not f.get("test_only")]
if not fams:
    sys.exit("FAIL: no families found")
with open(os.path.join(tmp, "list"), "w") as out:
    for f in fams:
        d = 64 if 64 in f["head_dims"] else f["head_dims"][0]
        params = {k: [v] for k, v in f.get("default_config", {}).items()}
        space = {"family": f["name"], "params": params, "head_dims": [d], "causal": [False, True],
                 "dtypes": f["dtypes"]}
        json.dump(space, open(os.path.join(tmp, f["name"] + ".space.json"), "w"))
        probs = []
        for t in f["dtypes"]:
            common = {"head_dim": d, "dtype": t, "direction": f["direction"]}
            probs += [dict(common, batch=1, heads=1, seq_q=1, seq_k=1, causal=False),
                      dict(common, batch=1, heads=1, seq_q=4096, seq_k=1, causal=True)]
            for inputs in ({"distribution": "normal", "scale": 30}, {"distribution": "heavy", "scale": 3}):
                for c in (False, True):
                    probs.append(dict(common, batch=1, heads=2, seq_q=200, seq_k=333, causal=c, inputs=inputs))
        json.dump({"problems": probs}, open(os.path.join(tmp, f["name"] + ".problems.json"), "w"))
        out.write(f'{f["name"]} {int(bool(f.get("hopper_only")))} {len(probs)}\n')
PY

while read -r fam hopper expected; do
  "$FLASHTUNE" tune "$tmp/$fam.space.json" "$tmp/$fam.problems.json" --db "$tmp/$fam.db" --timeout 60 --quiet \
    >"$tmp/$fam.out" 2>&1 || { echo "FAIL: tune $fam exited non-zero"; cat "$tmp/$fam.out"; fail=1; continue; }
  cat "$tmp/$fam.out"
  python3 - "$tmp/$fam.db" "$fam" "$hopper" "$expected" <<'PY' || fail=1
import sqlite3, sys
db, fam, hopper, expected = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
rows = sqlite3.connect(db).execute(
    "select dtype, causal, seq_q, seq_k, inputs, status, error from results where family=?", (fam,)).fetchall()
pruned = [r for r in rows if r[5] == "pruned" and hopper and "sm_90a" in (r[6] or "")]
if pruned and len(pruned) == len(rows):
    print(f"{fam}: hopper-only, pruned off sm_90 ({len(rows)} rows), not counted")
    sys.exit(0)
ok = [r for r in rows if r[5] == "ok"]
bad = [r for r in rows if r[5] != "ok"]
for r in bad:
    print(f"  {fam} {r[0]} causal={r[1]} Sq={r[2]} Sk={r[3]} inputs={r[4]}: {r[5]} {(r[6] or '')[:300]}")
if len(rows) != expected or len(ok) != expected:
    sys.exit(f"FAIL: {fam}: want {expected} ok rows, got {len(ok)} ok of {len(rows)}")
print(f"{fam}: {len(ok)} of {expected} ok (Sk = 1, normal*30, heavy*3)")
PY
done <"$tmp/list"

# (b) slightly wrong kernels.
python3 - "$tmp" <<'PY' || exit 1
import json, os, sys
probs = []
for t in ("fp32", "fp16", "bf16"):
    for d in (32, 64):
        for c in (False, True):
            for inputs in ({"distribution": "normal", "scale": 1}, {"distribution": "normal", "scale": 30}):
                probs.append({"batch": 1, "heads": 2, "seq_q": 100, "seq_k": 130, "head_dim": d, "dtype": t,
                              "causal": c, "inputs": inputs})
json.dump({"problems": probs}, open(os.path.join(sys.argv[1], "fault.problems.json"), "w"))
PY
"$FLASHTUNE" tune "$SRC/configs/spaces/fault_wrong.json" "$tmp/fault.problems.json" --db "$tmp/fault.db" --timeout 30 \
  --quiet >"$tmp/fault.out" 2>&1 || { echo "FAIL: tune fault_wrong exited non-zero"; cat "$tmp/fault.out"; exit 1; }
cat "$tmp/fault.out"
python3 - "$tmp/fault.db" <<'PY' || fail=1
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "select config, dtype, head_dim, causal, inputs, status, error from results").fetchall()
want = {"MODE=0": "ok", "MODE=3": "invalid", "MODE=4": "invalid"}
bad = [r for r in rows if want.get(r[0]) != r[5]]
for r in bad:
    print("  mismatch:", r[:6], (r[6] or "")[:200])
for m in want:
    for t in ("fp32", "fp16", "bf16"):
        n = sum(1 for r in rows if r[0] == m and r[1] == t and r[5] == want[m])
        print(f"  {m} {t}: {n} of 8 {want[m]}")
if len(rows) != 72 or bad:
    sys.exit(f"FAIL: want 72 rows (3 modes x 3 dtypes x 2 d x 2 masks x 2 input scales), got {len(rows)}, {len(bad)} mismatches")
PY

[ "$fail" = 0 ] || exit 1
echo "gpu_validate_inputs: passed"
