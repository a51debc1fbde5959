#!/usr/bin/env bash
# On a GPU: every variant of every family's space (configs/spaces/<family>.json) validates against the
# float64 reference on ragged shapes (Sq != Sk, no tile divides, causal with fully masked rows), every
# head dim, every dtype of the family. Families come from `flashtune families --json`; each gets the
# committed ragged problem set (configs/problems/ragged*.json) of its direction that spans its dtypes and
# head dims. No list of families here: a family without a space or a ragged set fails.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
db=${VALIDATE_DB:-$tmp/v.db}
fail=0
"$FLASHTUNE" families --json >"$tmp/families.json" || { echo "FAIL: flashtune families"; exit 1; }
python3 - "$tmp/families.json" "$SRC" >"$tmp/plan.txt" <<'PY' || fail=1
import glob, json, os, sys
families = [f for f in json.load(open(sys.argv[1])) if not f["test_only"]]
src = sys.argv[2]
def problems(path):  # the explicit-list form; ragged sets are lists (a grid divides by design)
    return json.load(open(path)).get("problems", [])
ragged = sorted(glob.glob(os.path.join(src, "configs/problems/ragged*.json")))
bad = False
for f in families:
    space = os.path.join(src, "configs/spaces", f["name"] + ".json")
    if not os.path.exists(space):
        print(f"FAIL: family {f['name']} has no space file {space}", file=sys.stderr); bad = True; continue
    pick = None
    for path in ragged:
        ps = problems(path)
        if not ps or any(p.get("direction", "fwd") != f["direction"] for p in ps):
            continue
        if any("varlen" in p for p in ps):  # packed batches: a family's varlen form, the varlen device stage's
            continue
        if any("paged" in p for p in ps):  # paged caches: a family's paged form, the decode-paged device stage's
            continue
        if any("window" in p or "softcap" in p for p in ps):  # issue 32's modified variants: their own stage
            continue
        dtypes = {p.get("dtype", "fp32") for p in ps}
        dims = {p["head_dim"] for p in ps}
        if dtypes == set(f["dtypes"]) and set(f["head_dims"]) <= dims:
            pick = path; break
    if pick is None:
        print(f"FAIL: no configs/problems/ragged*.json for family {f['name']} ({f['direction']}, dtypes "
              f"{f['dtypes']}, head dims {f['head_dims']})", file=sys.stderr); bad = True; continue
    print(f["name"], space, pick, sep="\t")
sys.exit(1 if bad else 0)
PY
while IFS=$'\t' read -r family space problems; do
  echo "$family: $(basename "$space") on $(basename "$problems")"
  "$FLASHTUNE" tune "$space" "$problems" --db "$db" --quiet || { echo "FAIL: tune $family"; fail=1; }
done <"$tmp/plan.txt"
python3 - "$db" "$tmp/plan.txt" <<'PY' || fail=1
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
families = [line.split("\t")[0] for line in open(sys.argv[2]) if line.strip()]
rows = c.execute("select family, status, count(*) from results group by family, status").fetchall()
for r in rows: print(*r)
bad = c.execute("select family, config, head_dim, causal, seq_q, seq_k, status, error from results "
                "where status not in ('ok', 'pruned')").fetchall()
for b in bad[:20]: print("BAD", b)
ok = {f: n for f, s, n in rows if s == "ok"}
none_ok = [f for f in families if ok.get(f, 0) == 0]
if bad or none_ok or not families:
    sys.exit(f"FAIL: {len(bad)} candidates neither ok nor pruned; no ok candidate for {none_ok}")
PY
[[ $fail -eq 0 ]] && echo "gpu_validate_families: passed"
exit $fail
