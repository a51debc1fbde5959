#!/usr/bin/env bash
# flashtune export --format t4 / import: every committed store (copied, never changed) and a fixture
# holding every status are exported and validated against the published T4 schema (t4_export.py);
# each export imported into a new store and exported again gives the same bytes and the same rows; a
# second import changes nothing.
set -u
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
F=$FLASHTUNE
"$F" families --json >"$tmp/families.json" || exit 1

# A fixture with every status, an infinite error and a non-canonical config (a tunable added later).
"$FIXTURE_TOOL" "$tmp/fixture.db" || exit 1
python3 - "$tmp/fixture.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
base = c.execute("select * from results where status='crashed'").fetchone()
cols = [r[1] for r in c.execute("pragma table_info(results)")]
for i, status in enumerate(["timeout", "compile_error", "launch_error", "error", "pruned"]):
    row = dict(zip(cols, base), id=None, kernel_hash=f"h-{status}", status=status, error=f"why {status}\nsecond line",
               registers=40 + i, spill_stores=8 * i)
    c.execute(f"insert into results({','.join(cols)}) values({','.join('?' * len(cols))})", [row[k] for k in cols])
c.execute("update results set max_rel=9e999, detail='{\"validated_rows\":512}' where status='invalid'")
c.execute("update results set config='BLOCK_M=64,BLOCK_N=32,TM=4,TN=4' where status='pruned'")
c.commit()
PY
# Packed variable-length rows (schema 7): a list and a seeded distribution, their count and longest lengths
# as flashtune derives them (`flashtune problems`), exported with the description and imported back whole.
echo '{"problems":[{"heads":4,"heads_k":2,"head_dim":64,"dtype":"bf16","causal":true,"varlen":{"seq_lens":[1,17,0,300],"seq_lens_k":[1,20,5,300]}},
  {"heads":2,"head_dim":64,"dtype":"bf16","varlen":{"lengths":"uniform","min":8,"max":64,"total_tokens":100,"seed":3}}]}' >"$tmp/vl.json"
"$F" problems "$tmp/vl.json" --json >"$tmp/vl_points.json" || exit 1
python3 - "$tmp/fixture.db" "$tmp/vl_points.json" <<'PY'
import json, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
base = c.execute("select * from results where status='ok'").fetchone()
cols = [r[1] for r in c.execute("pragma table_info(results)")]
for i, p in enumerate(json.load(open(sys.argv[2]))):
    row = dict(zip(cols, base), id=None, kernel_hash=f"h-varlen-{i}", family="fa2_mma", config="BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2",
               dtype="bf16", head_dim=64, causal=int(p["causal"]), batch=p["batch"], heads=p["heads"], heads_k=p.get("heads_k", 0),
               seq_q=p["seq_q"], seq_k=p["seq_k"], varlen=json.dumps(p["varlen"], sort_keys=True, separators=(",", ":")))
    c.execute(f"insert into results({','.join(cols)}) values({','.join('?' * len(cols))})", [row[k] for k in cols])
c.commit()
PY
"$F" best --db "$tmp/fixture.db" --family fa2_mma --csv | grep -q 'seq_lens' || { echo "FAIL: the fixture's packed rows not read back"; fail=1; }
# Paged K/V cache rows (schema 8): cache lengths given (batch and seq_k derived) and not, exported with the
# description and imported back whole.
echo '{"problems":[{"heads":8,"heads_k":2,"seq_q":1,"head_dim":128,"dtype":"bf16","paged":{"page_size":64,"seed":3,"seq_lens_k":[300,0,65]}},
  {"batch":2,"heads":4,"seq_q":3,"seq_k":512,"head_dim":64,"dtype":"fp16","causal":true,"paged":{"page_size":256}}]}' >"$tmp/pg.json"
"$F" problems "$tmp/pg.json" --json >"$tmp/pg_points.json" || exit 1
python3 - "$tmp/fixture.db" "$tmp/pg_points.json" <<'PY'
import json, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
base = c.execute("select * from results where status='ok'").fetchone()
cols = [r[1] for r in c.execute("pragma table_info(results)")]
for i, p in enumerate(json.load(open(sys.argv[2]))):
    row = dict(zip(cols, base), id=None, kernel_hash=f"h-paged-{i}", family="decode_splitkv",
               config="SPLITS=16,BLOCK_N=64,WARPS=4,STAGES=2", dtype=p["dtype"], head_dim=p["head_dim"],
               causal=int(p["causal"]), batch=p["batch"], heads=p["heads"], heads_k=p.get("heads_k", 0),
               seq_q=p["seq_q"], seq_k=p["seq_k"], paged=json.dumps(p["paged"], sort_keys=True, separators=(",", ":")))
    c.execute(f"insert into results({','.join(cols)}) values({','.join('?' * len(cols))})", [row[k] for k in cols])
c.commit()
PY
"$F" best --db "$tmp/fixture.db" --family decode_splitkv --csv | grep -q 'page_size' || { echo "FAIL: the fixture's paged rows not read back"; fail=1; }

stores=("$tmp/fixture.db")
for db in "$SRC"/reports/*/results.db; do
  [[ -f "$db" ]] || continue
  name=$(basename "$(dirname "$db")")
  cp "$db" "$tmp/$name.db"
  stores+=("$tmp/$name.db")
done
committed_sums=$(sha256sum "$SRC"/reports/*/results.db 2>/dev/null)

same_rows() {  # same_rows A.db B.db: the results rows agree, ids and origins aside
  python3 - "$1" "$2" <<'PY'
import sqlite3, sys
def columns(p):
    c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    return [r[1] for r in c.execute("pragma table_info(results)") if r[1] not in ("id", "origin")]
def rows(p, cols):
    c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    return sorted(tuple("" if v is None else v for v in r) for r in c.execute(f"select {','.join(cols)} from results"))
# A store of an older schema lacks newer columns (v6's heads_k, v7's varlen, v8's paged, v9's window and softcap, v10's alibi,
# v11's mask_mod):
# those must hold their default.
ca, cb = columns(sys.argv[1]), columns(sys.argv[2])
common = [c for c in ca if c in cb]
defaults = {"heads_k": 0, "varlen": "", "paged": "", "window_left": -1, "window_right": -1, "softcap": 0, "alibi": 0,
            "mask_mod": ""}
for p, extra in ((sys.argv[1], set(ca) - set(cb)), (sys.argv[2], set(cb) - set(ca))):
    for col in extra:
        bad = sqlite3.connect(f"file:{p}?mode=ro", uri=True).execute(
            f"select count(*) from results where {col} != ?", (defaults.get(col, 0),)).fetchone()[0]
        if col not in defaults or bad:
            print(f"column {col} only in {p} ({bad} rows not 0)"); sys.exit(1)
a, b = rows(sys.argv[1], common), rows(sys.argv[2], common)
if a != b:
    print(f"{len(a)} rows vs {len(b)}, {len(set(a) ^ set(b))} differ"); sys.exit(1)
PY
}

for db in "${stores[@]}"; do
  n=$(basename "$db" .db)
  start=$SECONDS
  "$F" export --db "$db" --format t4 -o "$tmp/$n.json" || { echo "FAIL: export $n"; fail=1; continue; }
  python3 "$SRC/tests/t4_export.py" "$SRC/tests/data/t4/results-schema.json" "$tmp/$n.json" "$db" "$tmp/families.json" ||
    fail=1
  "$F" import --db "$tmp/$n.back.db" "$tmp/$n.json" >/dev/null || { echo "FAIL: import $n"; fail=1; continue; }
  "$F" export --db "$tmp/$n.back.db" -o "$tmp/$n.again.json" || { echo "FAIL: export of the import of $n"; fail=1; }
  cmp -s "$tmp/$n.json" "$tmp/$n.again.json" || { echo "FAIL: $n: export -> import -> export differs"; fail=1; }
  same_rows "$db" "$tmp/$n.back.db" || { echo "FAIL: $n: the imported rows differ from the stored ones"; fail=1; }
  sum=$(sha256sum <"$tmp/$n.back.db")
  out=$("$F" import --db "$tmp/$n.back.db" "$tmp/$n.json")
  [[ $out == *"already imported"* && "$(sha256sum <"$tmp/$n.back.db")" == "$sum" ]] ||
    { echo "FAIL: $n: a second import changed the store: $out"; fail=1; }
  echo "$n: export, validate, import, export again: $((SECONDS - start)) s"
done

# stdout and a filter: the fixture's H200 rows only.
"$F" export --db "$tmp/fixture.db" --device "NVIDIA H200" >"$tmp/h200_only.json" || { echo "FAIL: export to stdout"; fail=1; }
want=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select count(*) from results where device_name=?", ("NVIDIA H200",)).fetchone()[0])' "$tmp/fixture.db")
got=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d["results"]), d["metadata"]["device"])' "$tmp/h200_only.json")
[[ $got == "$want NVIDIA H200" ]] || { echo "FAIL: --device filter: $got, want $want NVIDIA H200"; fail=1; }
# A compile-only store has no results: an empty, valid document.
python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("delete from results"); c.commit()' "$tmp/fixture.db"
"$F" export --db "$tmp/fixture.db" -o "$tmp/empty.json" &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(d["results"] != [])' "$tmp/empty.json" ||
  { echo "FAIL: export of a store without results"; fail=1; }

[[ "$(sha256sum "$SRC"/reports/*/results.db 2>/dev/null)" == "$committed_sums" ]] || { echo "FAIL: a committed store changed"; fail=1; }
[[ $fail -eq 0 ]] && echo "t4_export: all passed"
exit $fail
