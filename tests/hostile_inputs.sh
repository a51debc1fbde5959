#!/usr/bin/env bash
# Untrusted input must not hurt: hostile values, JSON, databases and file system tricks each get one
# line and exit 2 (or, where documented, a harmless success), and nothing already stored changes.
# No GPU needed: tune compiles only (sm_80); spaces are tiny (the naive family).
set -u
fail=0
cases=0
tmp=$(mktemp -d)
planted=()
cleanup() {
  for l in "${planted[@]}"; do
    [[ -L "$l" ]] && rm -f "$l"
    [[ -d "$l" ]] && chmod -R u+w "$l" && rm -rf "$l"
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
F=$FLASHTUNE
NAIVE=$SRC/configs/spaces/naive.json

# Protected state: a valid store and an emitted header folder that no failing case may change.
"$FIXTURE_TOOL" "$tmp/fixture.db" || exit 1
"$F" emit --db "$tmp/fixture.db" --out "$tmp/headers" >/dev/null || { echo "FAIL: initial emit"; exit 1; }
state() { (cd "$tmp" && sha256sum fixture.db headers/* 2>&1); }
protected=$(state)

check_protected() {
  if [[ "$(state)" != "$protected" ]]; then
    echo "FAIL ($1): the protected store or header folder changed"; fail=1
    protected=$(state)
  fi
}

# limited CMD...: CMD in about 2 GB of memory: ulimit -v, or under ASan (FT_SANITIZE, whose shadow memory takes
# terabytes of address space) its hard_rss_limit_mb.
limited() {
  if [[ "${FT_SANITIZE:-}" == *address* ]]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=2000:quarantine_size_mb=16" "$@"  # (see capped)
  else
    (ulimit -v 2000000; "$@")
  fi
}
ft_run=()  # a prefix for flashtune in expect_usage_error (bounded: limited timeout)

# expect_usage_error "<needle>" args...: exit 2, exactly one stderr line holding the needle.
expect_usage_error() {
  local needle=$1; shift
  cases=$((cases + 1))
  "${ft_run[@]}" "$F" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [[ $rc -ne 2 || $lines -ne 1 ]] || ! grep -q -F -- "$needle" "$tmp/err"; then
    echo "FAIL: flashtune $(echo "$*" | cut -c1-150) -> rc=$rc, $lines stderr lines, want 2 and one line with '$needle':"
    head -c 600 "$tmp/err"; echo
    fail=1
  elif [[ $(wc -c <"$tmp/err") -gt 700 ]]; then
    echo "FAIL: flashtune $(echo "$*" | cut -c1-100): message longer than 700 bytes"; fail=1
  fi
  check_protected "$needle"
}
ok() {  # ok "<what>" <condition command...>
  local what=$1; shift
  cases=$((cases + 1))
  "$@" || { echo "FAIL: $what"; fail=1; }
  check_protected "$what"
}
sql() { python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); r = c.execute(sys.argv[2]).fetchall(); c.commit(); print("\n".join("|".join(map(str, x)) for x in r))' "$@"; }

cat >"$tmp/space.json" <<'EOF'
{"family": "naive", "params": {"THREADS": [128, 256]}, "head_dims": [64], "causal": [false], "dtypes": ["fp32"]}
EOF
echo '{"problems": [{"batch": 1, "heads": 2, "seq": 64, "head_dim": 64}]}' >"$tmp/problems.json"
python3 - "$tmp" <<'PY'
import json, os, sys
t = sys.argv[1]
w = lambda name, text: open(os.path.join(t, name), "w").write(text)
w("deep_space.json", '{"family": "naive", "params": {"THREADS": ' + "[" * 100000 + "]" * 100000 + "}}")
w("deep_problems.json", '{"problems": ' + "[" * 70 + "]" * 70 + "}")
w("deep_exp.json", '{"name": "x", "problems": ' + "{\"a\":" * 5000 + "1" + "}" * 5000 + "}")
w("huge_threads.json", '{"family": "naive", "params": {"THREADS": [4294967424]}, "head_dims": [64]}')
w("neg_threads.json", '{"family": "naive", "params": {"THREADS": [-4294967168]}, "head_dims": [64]}')
w("huge_u64.json", '{"family": "naive", "params": {"THREADS": [18446744073709551615]}, "head_dims": [64]}')
w("float_dim.json", '{"family": "naive", "head_dims": [64.0]}')
w("str_threads.json", '{"family": "naive", "params": {"THREADS": "128"}}')
w("array_space.json", "[]")
w("long_family.json", json.dumps({"family": "A" * 200000}))
w("ctrl_family.json", json.dumps({"family": "x\n#error\u001b[2J"}))
w("dupes.json", '{"family": "naive", "params": {"THREADS": [' + ",".join(["128"] * 1000000) + ']}, "head_dims": [64, 64, 64], "causal": [false, false], "dtypes": ["fp32", "fp32"]}')
w("large.json", json.dumps({"family": "fa1_simt", "params": {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256],
  "TM": [1, 2, 4, 8, 16], "TN": [1, 2, 4, 8, 16], "Q_STAGES": [1, 2], "Q_SPLIT": [1, 2, 4, 8, 16]}}))
w("big_batch.json", '{"problems": [{"batch": 4294967297, "heads": 1, "seq": 8, "head_dim": 64}]}')
w("overflow_batch.json", '{"problems": [{"batch": 1e400, "heads": 1, "seq": 8, "head_dim": 64}]}')
w("float_batch.json", '{"problems": [{"batch": 1.5, "heads": 1, "seq": 8, "head_dim": 64}]}')
w("big_grid.json", '{"grid": {"tokens": 4294967296, "hidden": 128, "seq": [64], "head_dim": [64]}}')
w("causal_str.json", '{"problems": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 64, "causal": "yes"}]}')
w("nomatch.json", '{"problems": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 32}]}')
P = '{"problems": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 64}]}'
w("exp_title.json", '{"name": "x", "title": 5, "problems": ' + P + ', "implementations": ["naive"]}')
w("exp_reps.json", '{"name": "x", "problems": ' + P + ', "implementations": ["naive"], "reps": "many"}')
w("exp_tune.json", '{"name": "x", "problems": ' + P + ', "tune": "configs/spaces/naive.json"}')
w("exp_ok.json", '{"name": "x", "problems": ' + P + ', "implementations": ["naive"]}')
with open(os.path.join(t, "huge.json"), "w") as f:
    f.write('{"family": "naive", "description": "' + "x" * (17 << 20) + '"}')
PY

# --- JSON: nesting, sizes, narrowing, types, duplicates -------------------------------------
expect_usage_error "nests deeper than 64 levels" compile-check "$tmp/deep_space.json"
expect_usage_error "nests deeper than 64 levels" tune "$tmp/space.json" "$tmp/deep_problems.json" --db "$tmp/n.db"
expect_usage_error "nests deeper than 64 levels" experiment "$tmp/deep_exp.json" --dry-run
expect_usage_error "larger than 16 MiB" compile-check "$tmp/huge.json"
expect_usage_error "must be an integer in -2147483648..2147483647, got 4294967424" compile-check "$tmp/huge_threads.json"
expect_usage_error "must be an integer in" compile-check "$tmp/neg_threads.json"
expect_usage_error "must be an integer in" compile-check "$tmp/huge_u64.json"
expect_usage_error "head_dims must hold integers only" compile-check "$tmp/float_dim.json"
expect_usage_error "must be a non-empty array of integers" compile-check "$tmp/str_threads.json"
expect_usage_error "a space must be a JSON object" compile-check "$tmp/array_space.json"
expect_usage_error "unknown family 'AAAA" compile-check "$tmp/long_family.json"
expect_usage_error "unknown family 'x?#error?[2J'" compile-check "$tmp/ctrl_family.json"
expect_usage_error "more than 20000 (--allow-large-space" compile-check "$tmp/large.json"
expect_usage_error "not a regular file" compile-check "$tmp"
expect_usage_error "does not exist" compile-check "$tmp/none.json"
expect_usage_error "'batch' must be an integer in 1..1048576, got 4294967297" tune "$tmp/space.json" "$tmp/big_batch.json" --db "$tmp/n.db"
expect_usage_error "'batch' must be an integer in 1..1048576, got 1.5" tune "$tmp/space.json" "$tmp/float_batch.json" --db "$tmp/n.db"
expect_usage_error "number overflow parsing '1e400'" tune "$tmp/space.json" "$tmp/overflow_batch.json" --db "$tmp/n.db"
expect_usage_error "grid tokens must be an integer in" tune "$tmp/space.json" "$tmp/big_grid.json" --db "$tmp/n.db"
expect_usage_error "'causal' must be true or false" tune "$tmp/space.json" "$tmp/causal_str.json" --db "$tmp/n.db"
# The search options: refused in one line before any work.
expect_usage_error "unknown --strategy 'annealing'" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --strategy annealing
expect_usage_error "--max-evals must be a count" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --max-evals 150%
expect_usage_error "--max-evals must be a count" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --max-evals -3
expect_usage_error "--time-budget must be a duration" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --time-budget 10parsecs
expect_usage_error "--shard must be k/n" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --shard 3/3
expect_usage_error "--devices must be a comma-separated list" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --devices "0;rm -rf /"
expect_usage_error "give --device or --devices, not both" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --device 0 --devices 0,1
expect_usage_error "--replay database" tune "$tmp/space.json" "$tmp/problems.json" --replay "$tmp/absent.db"
expect_usage_error "--replay writes nothing: drop --db" tune "$tmp/space.json" "$tmp/problems.json" --replay "$tmp/fixture.db" --db "$tmp/fixture.db"
expect_usage_error "--stop-margin must be a positive number" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --stop-margin -1
expect_usage_error "--pause-us must be an integer in 0..100000" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --pause-us 200000
expect_usage_error "--pause-us must be an integer in 0..100000" run --family naive --params THREADS=256 --shape 1,1,8,8,32 --pause-us -5
expect_usage_error "--worker-threads must be an integer in 1..4096, got '0'" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/n.db" --worker-threads 0
expect_usage_error "experiment: 'title' must be a string" experiment "$tmp/exp_title.json" --dry-run
expect_usage_error "'reps' must be a number" experiment "$tmp/exp_reps.json" --dry-run
expect_usage_error "'tune' must be a list" experiment "$tmp/exp_tune.json" --dry-run
# A million duplicate values are one value: one variant, compiled once, in bounded memory.
cases=$((cases + 1))
if limited "$F" compile-check "$tmp/dupes.json" --arch sm_80 >"$tmp/out" 2>"$tmp/err"; then
  grep -q "naive sm_80: 1 variants: 1 compiled" "$tmp/out" || { echo "FAIL: dupes: $(tail -1 "$tmp/out")"; fail=1; }
else
  echo "FAIL: a space of duplicates: $(head -c 300 "$tmp/err")"; fail=1
fi
[[ $("$F" compile-check "$tmp/space.json" --arch sm_80 --allow-large-space 2>/dev/null | tail -1) == *"2 variants: 2 compiled"* ]] ||
  { echo "FAIL: --allow-large-space on a small space"; fail=1; }

# Paged caches: numbers past every range, narrowing, wrong types, a million lengths, a block table past 2^24.
DEC=$SRC/configs/spaces/decode_splitkv.json
pg() { echo "{\"problems\": [{\"batch\": 1, \"heads\": 8, \"heads_k\": 2, \"seq_q\": 1, \"seq_k\": 64, \"head_dim\": 128, \"dtype\": \"bf16\", \"paged\": $1}]}" >"$tmp/pg.json"; }
pg '{"page_size": 4294967552}'
expect_usage_error "paged 'page_size' must be a multiple of 16 in 16..1048576, got 4294967552" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '{"page_size": 18446744073709551872}'
expect_usage_error "paged 'page_size' must be a multiple of 16" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '{"page_size": 256.0}'
expect_usage_error "paged 'page_size' must be a multiple of 16" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '{"page_size": 256, "seed": 9007199254740993}'
expect_usage_error "paged 'seed' must be an integer in 0..2^53" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '{"page_size": 256, "seq_lens_k": [4294967360]}'
expect_usage_error "paged 'seq_lens_k' holds 4294967360, not a length in 0..1048576" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '{"page_size": 256, "seq_lens_k": {"0": 64}}'
expect_usage_error "paged 'seq_lens_k' must be an array of 1..65535 lengths" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
pg '[{"page_size": 256}]'
expect_usage_error "problem field 'paged' must be an object" tune "$DEC" "$tmp/pg.json" --db "$tmp/n.db"
python3 -c "import json; print(json.dumps({'problems': [{'heads': 8, 'heads_k': 2, 'seq_q': 1, 'head_dim': 128, 'dtype': 'bf16', 'paged': {'page_size': 16, 'seq_lens_k': [64] * 1000000}}]}))" >"$tmp/pg_many.json"
expect_usage_error "paged 'seq_lens_k' must be an array of 1..65535 lengths" tune "$DEC" "$tmp/pg_many.json" --db "$tmp/n.db"
echo '{"problems": [{"batch": 65536, "heads": 8, "heads_k": 2, "seq_q": 1, "seq_k": 1048576, "head_dim": 128, "dtype": "bf16", "paged": {"page_size": 16}}]}' >"$tmp/pg_table.json"
expect_usage_error "paged: a block table of 4294967296 entries (batch x pages per sequence) is over 2^24" tune "$DEC" "$tmp/pg_table.json" --db "$tmp/n.db"
expect_usage_error "paged 'page_size' must be a multiple of 16" run --family decode_splitkv --params SPLITS=1 --shape 1,8,1,64,128 \
  --dtype bf16 --heads-k 2 --paged '{"page_size": -18446744073709551616}'
ok "no store made by refused paged problems" test ! -e "$tmp/n.db"

# --- command-line numbers: the full range before converting --------------------------------
RUN="run --family naive --shape 1,1,8,8,64"
expect_usage_error "THREADS = 4294967424 is outside its domain" run --family naive --params THREADS=4294967424 --shape 1,1,8,8,64
expect_usage_error "must be an integer, got '99999999999999999999'" run --family naive --params THREADS=99999999999999999999 --shape 1,1,8,8,64
expect_usage_error "parameter THREADS is given twice" run --family naive --params THREADS=128,THREADS=64 --shape 1,1,8,8,64
expect_usage_error "'batch' must be an integer in 1..1048576, got 4294967297" run --family naive --params THREADS=128 --shape 4294967297,1,8,8,64
expect_usage_error "--shape field head_dim is not an integer" run --family naive --params THREADS=128 --shape 1,1,8,8,99999999999999999999
expect_usage_error "--seed must be an integer" $RUN --params THREADS=128 --seed 99999999999999999999
expect_usage_error "--device must be an integer in 0..64" $RUN --params THREADS=128 --device 4294967296
expect_usage_error "--timeout must be a positive number" $RUN --params THREADS=128 --timeout inf
expect_usage_error "--timeout must be a positive number" $RUN --params THREADS=128 --timeout nan
expect_usage_error "--d must be an integer in 1..1024" best --db "$tmp/fixture.db" --d 4294967360

# --- database paths and files that are not ours ------------------------------------------
expect_usage_error "the database path is empty" tune "$tmp/space.json" "$tmp/problems.json" --db ""
expect_usage_error ":memory: would discard every result" tune "$tmp/space.json" "$tmp/problems.json" --db :memory:
expect_usage_error "SQLite URIs are not accepted" tune "$tmp/space.json" "$tmp/problems.json" --db "file:$tmp/u.db?mode=memory"
expect_usage_error "SQLite URIs are not accepted" best --db "file:$tmp/fixture.db"
expect_usage_error "is a folder" best --db "$tmp"
expect_usage_error "is a folder" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp"
: >"$tmp/zero.db"
expect_usage_error "is empty, not a flashtune database" best --db "$tmp/zero.db"
ok "a read-only verb left the zero-byte file at zero bytes" test ! -s "$tmp/zero.db"
echo "just text, not SQLite, but long enough to have a header: $(head -c 300 /dev/zero | tr '\0' x)" >"$tmp/text.db"
text_sum=$(sha256sum <"$tmp/text.db")
expect_usage_error "file is not a database" best --db "$tmp/text.db"
expect_usage_error "file is not a database" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/text.db"
ok "the text file is unchanged" test "$(sha256sum <"$tmp/text.db")" == "$text_sum"
expect_usage_error "database '$tmp/missing.db' does not exist" best --db "$tmp/missing.db"
expect_usage_error "does not exist" emit --db "$tmp/missing.db" --out "$tmp/headers"
expect_usage_error "does not exist" report --db "$tmp/missing.db"
expect_usage_error "does not exist" run --family naive --best --db "$tmp/missing.db" --shape 1,1,8,8,64
ok "read-only verbs created no file" test ! -e "$tmp/missing.db"
# Another application's SQLite file with a meta table and schema_version '2': never migrated.
sql "$tmp/foreign.db" "create table meta(key text primary key, value text)" >/dev/null
sql "$tmp/foreign.db" "insert into meta values('schema_version', '2')" >/dev/null
sql "$tmp/foreign.db" "create table accounts(id integer primary key, balance real)" >/dev/null
foreign_sum=$(sha256sum <"$tmp/foreign.db")
expect_usage_error "is not a flashtune database" best --db "$tmp/foreign.db"
expect_usage_error "is not a flashtune database" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/foreign.db"
expect_usage_error "is not a flashtune database" drop-cubins --db "$tmp/foreign.db"
expect_usage_error "is not a flashtune database" report --db "$tmp/foreign.db"
ok "the foreign store is unchanged" test "$(sha256sum <"$tmp/foreign.db")" == "$foreign_sum"
# Another application's id on an otherwise flashtune-shaped file; and a newer schema of ours.
cp "$tmp/fixture.db" "$tmp/otherid.db"
sql "$tmp/otherid.db" "pragma application_id=1234" >/dev/null
expect_usage_error "is not a flashtune database (application_id 1234)" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/otherid.db"
cp "$tmp/fixture.db" "$tmp/newer.db"
sql "$tmp/newer.db" "update meta set value='12' where key='schema_version'" >/dev/null
expect_usage_error "has schema version '12'" tune "$tmp/space.json" "$tmp/problems.json" --db "$tmp/newer.db"

# --- stored strings that become paths or source text ------------------------------------
add_row() {  # add_row DB DEVICE ARCH FAMILY CONFIG [DTYPE]
  python3 - "$@" <<'PY'
import sqlite3, sys
db, device, arch, family, config = sys.argv[1:6]
dtype = sys.argv[6] if len(sys.argv) > 6 else "fp32"
c = sqlite3.connect(db)
c.execute("""insert into results(kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,status,
  ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,driver_version,nvrtc_version,options,source_hash,created)
  values('h-evil',?,'fwd',?,1,1,128,128,64,?,0,'ok',1,1,1,3,1.5,1,1,?,?,1,13000,'13.0','','','now')""",
          (family, config, dtype, device, arch))
c.commit()
PY
}
cp "$tmp/fixture.db" "$tmp/traversal.db"
add_row "$tmp/traversal.db" "Evil GPU" "../../x/pwn" fa2_simt "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2"
expect_usage_error "arch '../../x/pwn'" emit --db "$tmp/traversal.db" --out "$tmp/headers"
ok "nothing written outside --out" test ! -e "$tmp/x" -a ! -e "$tmp/../x/pwn"
cp "$tmp/fixture.db" "$tmp/family.db"
add_row "$tmp/family.db" "Evil GPU" sm_90 'fa2_simt", "x"}; #error' "BLOCK_M=64"
expect_usage_error "unknown family" emit --db "$tmp/family.db" --out "$tmp/headers"
cp "$tmp/fixture.db" "$tmp/config.db"
add_row "$tmp/config.db" "Evil GPU" sm_90 fa2_simt "BLOCK_M=64}; #error x"
expect_usage_error "parameter BLOCK_M must be an integer, got '64}; #error x'" emit --db "$tmp/config.db" --out "$tmp/headers"
cp "$tmp/fixture.db" "$tmp/dtype.db"
add_row "$tmp/dtype.db" "Evil GPU" sm_90 fa2_simt "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2" 'fp32"; #error'
expect_usage_error "results row 9: unknown dtype" best --db "$tmp/dtype.db"
# A device name with a newline and a preprocessor line never reaches a header: refused as merge and import
# refuse it (control characters; a NUL would cut the table's name short), nothing written. A printable name
# with quotes, a backslash and a trigraph stays inside its escaped C string literal.
cp "$tmp/fixture.db" "$tmp/newline.db"
add_row "$tmp/newline.db" $'Evil\n#error injected\n// \\' sm_90 fa2_simt "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2"
cp -r "$tmp/headers" "$tmp/headers2"
headers2_sum=$(cd "$tmp/headers2" && sha256sum *)
expect_usage_error "device name holds control characters" emit --db "$tmp/newline.db" --out "$tmp/headers2"
ok "no header written for a device name with a newline" test "$(cd "$tmp/headers2" && sha256sum *)" == "$headers2_sum"
cp "$tmp/fixture.db" "$tmp/quoted.db"
add_row "$tmp/quoted.db" 'Evil "GPU" \ ??/ */ #error' sm_90 fa2_simt "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2"
cases=$((cases + 1))
if "$F" emit --db "$tmp/quoted.db" --out "$tmp/headers3" >/dev/null 2>"$tmp/err"; then
  grep -qF 'kTable{"Evil \"GPU\" \\ \?\?/ */ #error"' "$tmp"/headers3/sm90_evil_gpu_error.hpp ||
    { echo "FAIL: device name not escaped as a C string"; fail=1; }
  if command -v g++ >/dev/null; then
    g++ -std=c++17 -fsyntax-only -I"$SRC/templates" -x c++ "$tmp/headers3/dispatch.hpp" 2>"$tmp/gxx" ||
      { echo "FAIL: the emitted headers do not compile:"; head -5 "$tmp/gxx"; fail=1; }
  fi
else
  echo "FAIL: emit of a quoted device name: $(cat "$tmp/err")"; fail=1
fi
: >"$tmp/a_file"
expect_usage_error "is not a folder that can be created" emit --db "$tmp/fixture.db" --out "$tmp/a_file"

# --- no shell: a path with $(...) and quotes reaches python as data ------------------------
evil="$tmp/a'\$(touch $tmp/PWNED)'b"
mkdir -p "$evil"
cp "$tmp/fixture.db" "$evil/results.db"
cases=$((cases + 1))
"$F" report --db "$evil/results.db" >/dev/null 2>"$tmp/err" || { echo "FAIL: report on a quoted path: $(tail -2 "$tmp/err")"; fail=1; }
[[ -e "$tmp/PWNED" ]] && { echo "FAIL: report ran a shell command from its arguments"; fail=1; }
[[ -f "$evil/REPORT.md" ]] || { echo "FAIL: report wrote no REPORT.md"; fail=1; }
expect_usage_error "--gpu takes a folder name" report --gpu "x'\$(touch $tmp/PWNED2)'/y"
cd "$tmp"
expect_usage_error "does not exist" report --gpu "x'\$(touch PWNED2)'" --reports "$tmp"
ok "no marker from --gpu" test ! -e "$tmp/PWNED2"
expect_usage_error "exactly one of --db PATH and --gpu SLUG" report --db "$tmp/fixture.db" --gpu x

# --- silent no-ops are errors, before any work ------------------------------------------
expect_usage_error "matches a variant" tune "$tmp/space.json" "$tmp/nomatch.json" --db "$tmp/nomatch.db"
ok "no store created for a sweep that matches nothing" test ! -e "$tmp/nomatch.db"
expect_usage_error "no GPU found" experiment "$tmp/exp_ok.json" --db "$tmp/exp.db"
ok "no store created by an experiment without a GPU" test ! -e "$tmp/exp.db"

# --- a store of schema 3 (before application_id) is read as is, migrated only by a write verb ----
cp "$tmp/fixture.db" "$tmp/v3.db"
python3 "$SRC/tests/make_v3_store.py" "$tmp/v3.db"
v3_sum=$(sha256sum <"$tmp/v3.db")
cases=$((cases + 1))
n3=$("$F" best --db "$tmp/v3.db" --csv | wc -l)
[[ "$(sha256sum <"$tmp/v3.db")" == "$v3_sum" && $n3 -gt 1 ]] || { echo "FAIL: best changed or could not read a v3 store"; fail=1; }
"$F" report --db "$tmp/v3.db" --out "$tmp/v3report" >/dev/null 2>&1 || { echo "FAIL: report of a v3 store"; fail=1; }
[[ "$(sha256sum <"$tmp/v3.db")" == "$v3_sum" ]] || { echo "FAIL: report changed a v3 store"; fail=1; }
cases=$((cases + 1))
"$F" drop-cubins --db "$tmp/v3.db" || { echo "FAIL: drop-cubins on v3"; fail=1; }
[[ "$(sql "$tmp/v3.db" "select value from meta"),$(sql "$tmp/v3.db" "pragma application_id")" == "11,1181504622" ]] ||
  { echo "FAIL: v3 not migrated to 11 with our application_id"; fail=1; }
[[ "$(sql "$tmp/v3.db" "select count(*), count(distinct inputs) from results")" == "8|1" ]] ||
  { echo "FAIL: migrated results: $(sql "$tmp/v3.db" "select count(*), group_concat(distinct inputs) from results")"; fail=1; }
[[ $("$F" best --db "$tmp/v3.db" --csv | wc -l) -eq $n3 ]] || { echo "FAIL: best after migration"; fail=1; }

# --- merge, export, import: bad stores and T4 files refused, the target store unchanged ------------
# (the protected fixture.db is the merge output and the import target in every case)
expect_usage_error "is not a flashtune database" merge "$tmp/foreign.db" -o "$tmp/fixture.db"
expect_usage_error "has schema version '12'" merge "$tmp/newer.db" -o "$tmp/fixture.db"
expect_usage_error "file is not a database" merge "$tmp/text.db" -o "$tmp/fixture.db"
expect_usage_error "is empty, not a flashtune database" merge "$tmp/zero.db" -o "$tmp/fixture.db"
expect_usage_error "is a folder" merge "$tmp" -o "$tmp/fixture.db"
expect_usage_error "arch '../../x/pwn' is not sm_NN[a]" merge "$tmp/traversal.db" -o "$tmp/fixture.db"
expect_usage_error "unknown family" merge "$tmp/family.db" -o "$tmp/fixture.db"
expect_usage_error "unknown dtype" merge "$tmp/dtype.db" -o "$tmp/fixture.db"
expect_usage_error "holds control characters" merge "$tmp/newline.db" -o "$tmp/fixture.db"
cp "$tmp/fixture.db" "$tmp/sm.db"
sql "$tmp/sm.db" "update results set sm_count = 114 where device_name = 'NVIDIA H200'" >/dev/null
expect_usage_error "cannot merge: device 'NVIDIA H200' is sm_90, 132 SMs, driver 13000" merge "$tmp/sm.db" -o "$tmp/fixture.db"
expect_usage_error "is the output too" merge "$tmp/fixture.db" -o "$tmp/fixture.db"
expect_usage_error "is not a flashtune database" merge "$tmp/fixture.db" -o "$tmp/foreign.db"
ok "the foreign store is unchanged by merge" test "$(sha256sum <"$tmp/foreign.db")" == "$foreign_sum"
expect_usage_error "merge needs -o OUT.db" merge "$tmp/fixture.db"
expect_usage_error "merge needs at least one input" merge -o "$tmp/m.db"
expect_usage_error ":memory: would discard every result" merge "$tmp/fixture.db" -o :memory:
expect_usage_error "SQLite URIs are not accepted" merge "file:$tmp/fixture.db" -o "$tmp/m.db"
expect_usage_error "cannot merge: device 'NVIDIA H200'" merge "$tmp/fixture.db" "$tmp/sm.db" -o "$tmp/m.db"
ok "refused merges created no output" test ! -e "$tmp/m.db"

expect_usage_error "--format must be t4, got 'csv'" export --db "$tmp/fixture.db" --format csv
expect_usage_error "is a folder, not a file" export --db "$tmp/fixture.db" -o "$tmp"
expect_usage_error "does not exist" export --db "$tmp/missing.db"
expect_usage_error "is not a flashtune database" export --db "$tmp/foreign.db"
expect_usage_error "unknown family" export --db "$tmp/family.db" -o "$tmp/x.json"
ok "a refused export wrote no file" test ! -e "$tmp/x.json"

"$F" export --db "$tmp/fixture.db" -o "$tmp/t4.json" || { echo "FAIL: export of the fixture"; fail=1; }
# Changed copies of the export, one per case: python run on d (the document), r (its first ok result),
# ft (r's flashtune object) and m (r's measurements by name).
python3 - "$tmp" <<'PY'
import copy, json, os, sys
t = sys.argv[1]
cases = {
    "deep": r'd = "{\"results\": " + "[" * 100 + "]" * 100 + "}"',
    "notjson": r'd = "{\"results\": [1, 2"',
    "version": r'd["schema_version"] = "2.0.0"',
    "toplevel": r'd["extra"] = 1',
    "notarray": r'd["results"] = {}',
    "timeunit": r'd["metadata"]["timeunit"] = "seconds"',
    "resultkey": r'r["evil"] = 1',
    "nofamily": r'ft["family"] = "nope"',
    "ctrlfamily": r'ft["family"] = "x\n#error\u001b[2J"',
    "evilkey": r'r["configuration"]["EVIL"] = 1',
    "domain": r'r["configuration"]["BLOCK_M"] = 48',
    "narrowing": r'r["configuration"]["BLOCK_M"] = 4294967360',
    "floatcfg": r'r["configuration"]["BLOCK_M"] = 64.0',
    "missingcfg": r'del r["configuration"]["TM"]',
    "status": r'ft["status"] = "great"',
    "invalidity": r'r["invalidity"] = "timeout"',
    "correctness": r'r["correctness"] = 2',
    "negtime": r'm["time"]["value"] = -1',
    "unit": r'm["time"]["unit"] = "s"',
    "measure": r'r["measurements"].append({"name": "power", "value": 1, "unit": "W"})',
    "twice": r'r["measurements"].append(dict(m["time"]))',
    "devname": r'ft["device"]["name"] = "Evil\n#error injected"',
    "arch": r'ft["device"]["arch"] = "../../x/pwn"',
    "smcount": r'ft["device"]["sm_count"] = 0',
    "mismatch": r'ft["device"]["sm_count"] = 114',
    "batch": r'ft["problem"]["batch"] = 4294967297',
    "headdim": r'ft["problem"]["head_dim"] = 80',
    "seed": r'ft["seed"] = -1',
    "hash": r'ft["kernel_hash"] = ""',
}
original = json.load(open(os.path.join(t, "t4.json")))
for name, change in cases.items():
    d = copy.deepcopy(original)
    r = next(x for x in d["results"] if x["flashtune"]["status"] == "ok")
    ft = r["flashtune"]
    m = {x["name"]: x for x in r["measurements"]}
    exec(change)
    open(os.path.join(t, name + ".json"), "w").write(d if isinstance(d, str) else json.dumps(d))
PY
expect_usage_error "nests deeper than 64 levels" import --db "$tmp/fixture.db" "$tmp/deep.json"
expect_usage_error "is not valid JSON" import --db "$tmp/fixture.db" "$tmp/notjson.json"
expect_usage_error "schema_version '2.0.0' is not a T4 1.x.y version" import --db "$tmp/fixture.db" "$tmp/version.json"
expect_usage_error "a T4 document has an unknown field 'extra'" import --db "$tmp/fixture.db" "$tmp/toplevel.json"
expect_usage_error "'results' must be an array" import --db "$tmp/fixture.db" "$tmp/notarray.json"
expect_usage_error "metadata.timeunit must be \"milliseconds\"" import --db "$tmp/fixture.db" "$tmp/timeunit.json"
expect_usage_error "]: a result has an unknown field 'evil'" import --db "$tmp/fixture.db" "$tmp/resultkey.json"
expect_usage_error "unknown family 'nope'" import --db "$tmp/fixture.db" "$tmp/nofamily.json"
expect_usage_error "flashtune.family holds control characters: 'x?#error?[2J'" import --db "$tmp/fixture.db" "$tmp/ctrlfamily.json"
expect_usage_error "family fa2_simt has no tunable 'EVIL'" import --db "$tmp/fixture.db" "$tmp/evilkey.json"
expect_usage_error "BLOCK_M = 48 is outside its domain" import --db "$tmp/fixture.db" "$tmp/domain.json"
expect_usage_error "configuration.BLOCK_M must be an integer in -2147483648..2147483647, got 4294967360" import --db "$tmp/fixture.db" "$tmp/narrowing.json"
expect_usage_error "configuration.BLOCK_M must be an integer" import --db "$tmp/fixture.db" "$tmp/floatcfg.json"
expect_usage_error "configuration has no TM" import --db "$tmp/fixture.db" "$tmp/missingcfg.json"
expect_usage_error "unknown status 'great'" import --db "$tmp/fixture.db" "$tmp/status.json"
expect_usage_error "invalidity 'timeout' does not go with status" import --db "$tmp/fixture.db" "$tmp/invalidity.json"
expect_usage_error "correctness must be" import --db "$tmp/fixture.db" "$tmp/correctness.json"
expect_usage_error "measurement time must be a number in 0.." import --db "$tmp/fixture.db" "$tmp/negtime.json"
expect_usage_error "measurement time must be in 'ms', got 's'" import --db "$tmp/fixture.db" "$tmp/unit.json"
expect_usage_error "unknown measurement 'power'" import --db "$tmp/fixture.db" "$tmp/measure.json"
expect_usage_error "measurement time is given twice" import --db "$tmp/fixture.db" "$tmp/twice.json"
expect_usage_error "flashtune.device.name holds control characters" import --db "$tmp/fixture.db" "$tmp/devname.json"
expect_usage_error "arch '../../x/pwn' is not sm_NN[a]" import --db "$tmp/fixture.db" "$tmp/arch.json"
expect_usage_error "flashtune.device.sm_count must be an integer in 1..4096, got 0" import --db "$tmp/fixture.db" "$tmp/smcount.json"
expect_usage_error "cannot import: device 'NVIDIA H100 80GB HBM3'" import --db "$tmp/fixture.db" "$tmp/mismatch.json"
expect_usage_error "'batch' must be an integer in 1..1048576, got 4294967297" import --db "$tmp/fixture.db" "$tmp/batch.json"
expect_usage_error "does not support head_dim 80" import --db "$tmp/fixture.db" "$tmp/headdim.json"
expect_usage_error "flashtune.seed must be an integer in 0.." import --db "$tmp/fixture.db" "$tmp/seed.json"
expect_usage_error "kernel_hash must be a non-empty string" import --db "$tmp/fixture.db" "$tmp/hash.json"
truncate -s 300M "$tmp/sparse.json"
expect_usage_error "is larger than 128 MiB" import --db "$tmp/fixture.db" "$tmp/sparse.json"
rm -f "$tmp/sparse.json"
expect_usage_error "cannot read" import --db "$tmp/fixture.db" "$tmp/none.json"
expect_usage_error "import takes one T4 file" import --db "$tmp/fixture.db"
expect_usage_error "is not a flashtune database" import --db "$tmp/foreign.db" "$tmp/t4.json"
ok "the foreign store is unchanged by import" test "$(sha256sum <"$tmp/foreign.db")" == "$foreign_sum"
expect_usage_error "unknown family 'nope'" import --db "$tmp/imp.db" "$tmp/nofamily.json"
ok "a refused import created no store" test ! -e "$tmp/imp.db"

# --- issue 34: stored strings as paths, outputs over inputs, headers, WAL stores, numbers, output text ---
# Stored names that become paths: a kernel's lowered name (compile-check --save-cubins), an experiment's name.
"$F" compile-check "$tmp/space.json" --arch sm_80 --db "$tmp/cc.db" >/dev/null 2>&1
for evil in '../../pwned' '/tmp/pwned' '..' '.hidden' 'a/b' ''; do
  cp "$tmp/cc.db" "$tmp/lowered.db"
  sql "$tmp/lowered.db" "update kernels set lowered_name='$evil'" >/dev/null
  mkdir -p "$tmp/cubins"
  expect_usage_error "is not a plain file name" compile-check "$tmp/space.json" --arch sm_80 --db "$tmp/lowered.db" --save-cubins "$tmp/cubins"
  [[ -n "$evil" ]] && expect_usage_error "is not a plain file name" merge "$tmp/lowered.db" -o "$tmp/fixture.db"
  ok "no cubin written for lowered name '$evil'" test -z "$(ls -A "$tmp/cubins")" -a ! -e "$tmp/pwned.cubin" -a ! -e /tmp/pwned.cubin
done
for evil in '../../x' 'a/b' 'UPPER' ''; do
  cp "$tmp/fixture.db" "$tmp/expname.db"
  sql "$tmp/expname.db" "insert into experiment_runs(experiment,title,device_name,probes,spec,created) values('$evil','t','d','{}','{}','now')" >/dev/null
  expect_usage_error "is not 1..64 of lower-case letters" merge "$tmp/expname.db" -o "$tmp/fixture.db"
done
mkdir -p "$tmp/repout"
cases=$((cases + 1))
"$F" report --db "$tmp/expname.db" --out "$tmp/repout/in" >/dev/null 2>&1 || { echo "FAIL: report of a store with a bad experiment name"; fail=1; }
[[ "$(ls -A "$tmp/repout")" == in && -z "$(ls "$tmp/repout/in" | grep -v '^[A-Za-z0-9_.]*$')" ]] || { echo "FAIL: report wrote outside --out"; fail=1; }

# No verb writes over one of its inputs, however the path is spelled.
cp "$tmp/fixture.db" "$tmp/self.db"
ln -f "$tmp/self.db" "$tmp/self_hard.db"
ln -sf "$tmp/self.db" "$tmp/self_link.db"
self_sum=$(sha256sum <"$tmp/self.db")
for out in "$tmp/self.db" "$tmp/./self.db" "$tmp/../$(basename "$tmp")/self.db" "$tmp/self_hard.db" "$tmp/self_link.db"; do
  expect_usage_error "is the --db store" export --db "$tmp/self.db" -o "$out"
  expect_usage_error "is the --db store" export --db "$tmp/self.db" --output="$out"
done
expect_usage_error "is the --db store itself" import --db "$tmp/self.db" "$tmp/self_hard.db"
expect_usage_error "is the output too" merge "$tmp/self_link.db" -o "$tmp/self.db"
mkdir -p "$tmp/selfemit"
cp "$tmp/fixture.db" "$tmp/selfemit/dispatch.hpp"
expect_usage_error "refusing to emit" emit --db "$tmp/selfemit/dispatch.hpp" --out "$tmp/selfemit"
cp "$tmp/fixture.db" "$tmp/selfemit/sm90_nvidia_h200.hpp"
expect_usage_error "refusing to emit" emit --db "$tmp/selfemit/sm90_nvidia_h200.hpp" --out "$tmp/selfemit"
for name in best.csv REPORT.md x.png; do
  mkdir -p "$tmp/selfrep"
  cp "$tmp/fixture.db" "$tmp/selfrep/$name"
  expect_usage_error "it would overwrite the store" report --db "$tmp/selfrep/$name"
  expect_usage_error "it would overwrite the store" report --db "$tmp/selfrep/$name" --out "$tmp/selfrep/."
done
expect_usage_error "--output needs a value" export --db "$tmp/self.db" -o -o
expect_usage_error "--output needs a value" merge "$tmp/self.db" -o --quiet
ok "no file named --output" test ! -e ./--output -a ! -e "$tmp/--output"
ok "the store written over by no verb" test "$(sha256sum <"$tmp/self.db")" == "$self_sum"

# Generated headers: another device's header of the same name, stray or linked *.hpp, a folder in the way,
# device names past 255 bytes.
cp -r "$tmp/headers" "$tmp/h4"
h4_sum=$(cd "$tmp/h4" && sha256sum *)
for other in 'nvidia-h200' 'NVIDIA  H200' 'nvidia_H200!'; do
  cp "$tmp/fixture.db" "$tmp/slug.db"
  sql "$tmp/slug.db" "update results set device_name='$other' where device_name='NVIDIA H200'" >/dev/null
  expect_usage_error "holds another device's table" emit --db "$tmp/slug.db" --out "$tmp/h4"
done
echo '#error planted' >"$tmp/h4/sm90_planted.hpp"
echo '#error planted' >"$tmp/h4/evil.hpp"
ln -s "$tmp/h4/sm90_planted.hpp" "$tmp/h4/sm90_linked.hpp"
cases=$((cases + 1))
"$F" emit --db "$tmp/fixture.db" --out "$tmp/h4" >/dev/null 2>"$tmp/err" || { echo "FAIL: emit beside stray headers: $(head -2 "$tmp/err")"; fail=1; }
grep -q "planted\|evil\|linked" "$tmp/h4/dispatch.hpp" && { echo "FAIL: dispatch.hpp includes a header emit did not write"; fail=1; }
rm -f "$tmp/h4/sm90_planted.hpp" "$tmp/h4/evil.hpp" "$tmp/h4/sm90_linked.hpp"
h4_sum=$(cd "$tmp/h4" && sha256sum *)
mkdir -p "$tmp/h5" && cp "$tmp/h4"/* "$tmp/h5/"
rm "$tmp/h5/sm90_nvidia_h200.hpp" && mkdir "$tmp/h5/sm90_nvidia_h200.hpp"
h5_before=$(cd "$tmp/h5" && sha256sum *.hpp 2>/dev/null)
expect_usage_error "is not a regular file of emit's" emit --db "$tmp/fixture.db" --out "$tmp/h5"
ok "a failing emit replaced no header" test "$(cd "$tmp/h5" && sha256sum *.hpp 2>/dev/null)" == "$h5_before"
rm -rf "$tmp/h5/sm90_nvidia_h200.hpp" && ln -s /etc/passwd "$tmp/h5/sm90_nvidia_h200.hpp"
expect_usage_error "is not a regular file of emit's" emit --db "$tmp/fixture.db" --out "$tmp/h5"
cp "$tmp/fixture.db" "$tmp/long.db"
sql "$tmp/long.db" "update results set device_name='$(printf 'GPU %.0s' $(seq 64))' where device_name='NVIDIA H200'" >/dev/null
cases=$((cases + 1))
if "$F" emit --db "$tmp/long.db" --out "$tmp/h6" >/dev/null 2>"$tmp/err"; then
  [[ $(ls "$tmp/h6" | awk '{ if (length($0) > m) m = length($0) } END { print m }') -le 255 ]] || { echo "FAIL: a header name past 255 bytes"; fail=1; }
else
  echo "FAIL: emit of a 256-byte device name: $(head -1 "$tmp/err")"; fail=1
fi

# WAL stores: read from a read-only folder, no -wal/-shm left by readers, a planted -wal never read.
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('pragma journal_mode=wal'); c.close()" "$tmp/wal.db" 2>/dev/null
cp "$tmp/fixture.db" "$tmp/wal.db"
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('pragma journal_mode=wal'); c.close()" "$tmp/wal.db"
ro=$(mktemp -d)
planted+=("$ro")
chmod 755 "$ro"
cp "$tmp/wal.db" "$ro/wal.db"
chmod 444 "$ro/wal.db"
chmod 555 "$ro"
as_other=()
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null; then as_other=(setpriv --reuid 65534 --regid 65534 --clear-groups); fi
for verb in "best --db $ro/wal.db" "best --db $ro/wal.db --csv" "export --db $ro/wal.db" "emit --db $ro/wal.db --out /proc/none/x"; do
  cases=$((cases + 1))
  "${as_other[@]}" "$F" $verb >/dev/null 2>"$tmp/err"
  rc=$?
  if [[ $verb == emit* ]]; then [[ $rc -eq 2 ]] && grep -q "not a folder that can be created" "$tmp/err" || { echo "FAIL: $verb on a read-only WAL store: rc=$rc $(head -1 "$tmp/err")"; fail=1; }
  else [[ $rc -eq 0 ]] || { echo "FAIL: $verb on a read-only WAL store: rc=$rc $(head -1 "$tmp/err")"; fail=1; }; fi
done
for verb in best export; do
  cases=$((cases + 1))
  "$F" $verb --db "$tmp/wal.db" >/dev/null 2>&1 || { echo "FAIL: $verb of a WAL store"; fail=1; }
  [[ ! -e "$tmp/wal.db-wal" && ! -e "$tmp/wal.db-shm" ]] || { echo "FAIL: $verb left -wal/-shm beside the store"; fail=1; }
done
"$F" report --db "$tmp/wal.db" --out "$tmp/walrep" >/dev/null 2>&1
ok "report left no -wal/-shm beside a WAL store" test ! -e "$tmp/wal.db-wal" -a ! -e "$tmp/wal.db-shm"
# A -wal made by another store, planted beside a store in rollback mode: refused, never read.
python3 - "$tmp" <<'PY'
import os, shutil, sqlite3, sys
t = sys.argv[1]
shutil.copy(os.path.join(t, "fixture.db"), os.path.join(t, "donor.db"))
c = sqlite3.connect(os.path.join(t, "donor.db"))
c.execute("pragma journal_mode=wal")
c.execute("pragma wal_autocheckpoint=0")
c.execute("delete from results")
c.commit()
shutil.copy(os.path.join(t, "donor.db-wal"), os.path.join(t, "planted.wal"))
c.close()
PY
cp "$tmp/fixture.db" "$tmp/victim.db"
sql "$tmp/victim.db" "pragma journal_mode=delete" >/dev/null
victim_sum=$(sha256sum <"$tmp/victim.db")
cp "$tmp/planted.wal" "$tmp/victim.db-wal"
expect_usage_error "has a -wal file beside it that is not its own" best --db "$tmp/victim.db"
expect_usage_error "has a -wal file beside it that is not its own" export --db "$tmp/victim.db"
expect_usage_error "has a -wal file beside it that is not its own" merge "$tmp/victim.db" -o "$tmp/m.db"
rm -f "$tmp/victim.db-wal" && mkfifo "$tmp/victim.db-wal"
expect_usage_error "not a regular file" best --db "$tmp/victim.db"
rm -f "$tmp/victim.db-wal" && ln -s "$tmp/donor.db-wal" "$tmp/victim.db-wal"
expect_usage_error "not a regular file" best --db "$tmp/victim.db"
rm -f "$tmp/victim.db-wal"
ok "the victim store unchanged" test "$(sha256sum <"$tmp/victim.db")" == "$victim_sum"
if [[ $(id -u) -eq 0 ]]; then  # a second user's -wal beside a store in WAL mode: never read
  cp "$tmp/wal.db" "$tmp/victim2.db"
  cp "$tmp/planted.wal" "$tmp/victim2.db-wal"
  chown 65534:65534 "$tmp/victim2.db-wal"
  expect_usage_error "has a -wal file beside it that is not its own (another owner)" best --db "$tmp/victim2.db"
  expect_usage_error "has a -wal file beside it that is not its own (another owner)" report --db "$tmp/victim2.db" --out "$tmp/v2rep"
  rm -f "$tmp/victim2.db-wal"
fi

# A damaged store: a corrupt page, a missing column: one line, exit 2.
cp "$tmp/fixture.db" "$tmp/corrupt.db"
python3 -c "
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
for i in range(4096 + 8, len(b), 97): b[i] ^= 0x5a
open(sys.argv[1], 'wb').write(b)" "$tmp/corrupt.db"
expect_usage_error "flashtune:" best --db "$tmp/corrupt.db"
cp "$tmp/fixture.db" "$tmp/nocol.db"
sql "$tmp/nocol.db" "alter table results drop column gbps" >/dev/null
expect_usage_error "does not have the tables and columns" best --db "$tmp/nocol.db"
expect_usage_error "does not have the tables and columns" export --db "$tmp/nocol.db"
# A damaged record that SQLite refuses as out of memory (found by fuzz_store): the same one line, exit 2.
for verb in best export; do
  cp "$SRC/tests/fuzz/corpus/store/found_nomem_record.db" "$tmp/nomem.db"
  expect_usage_error "the database is damaged" $verb --db "$tmp/nomem.db"
done

# Numbers from outside: T4 figures that would decide best, timestamps, sizes that overflow.
python3 - "$tmp" <<'PY'
import copy, json, os, sys
t = sys.argv[1]
original = json.load(open(os.path.join(t, "t4.json")))
cases = {
    "tf_inf": lambda r, m: m["tflops"].update(value="inf"),
    "tf_nan": lambda r, m: m["tflops"].update(value="nan"),
    "tf_huge": lambda r, m: m["tflops"].update(value=1e300),
    "tf_big": lambda r, m: m["tflops"].update(value=20000.0),
    "time_inf": lambda r, m: m["time"].update(value="inf"),
    "time_zero": lambda r, m: m["time"].update(value=0),
    "gbps_inf": lambda r, m: r["measurements"].append({"name": "gbps", "value": "inf", "unit": "GB/s"}) if "gbps" not in m else m["gbps"].update(value="inf"),
    "ts_text": lambda r, m: r.update(timestamp="yesterday"),
    "ts_sql": lambda r, m: r.update(timestamp="2026-01-01'; drop table results; --"),
    "ts_future": lambda r, m: r.update(timestamp="99999-01-01T00:00:00Z"),
}
for name, change in cases.items():
    d = copy.deepcopy(original)
    r = next(x for x in d["results"] if x["flashtune"]["status"] == "ok")
    change(r, {x["name"]: x for x in r["measurements"]})
    open(os.path.join(t, name + ".json"), "w").write(json.dumps(d))
text = json.dumps(original)
open(os.path.join(t, "dupkey.json"), "w").write(text.replace('"schema_version"', '"results": [], "schema_version"', 1))
PY
for c in tf_inf tf_nan tf_huge tf_big; do expect_usage_error "measurement tflops must be a number in 0..10000" import --db "$tmp/fixture.db" "$tmp/$c.json"; done
expect_usage_error "measurement time must be a number" import --db "$tmp/fixture.db" "$tmp/time_inf.json"
expect_usage_error "measurement time must be above 0 for status ok" import --db "$tmp/fixture.db" "$tmp/time_zero.json"
expect_usage_error "measurement gbps must be a number" import --db "$tmp/fixture.db" "$tmp/gbps_inf.json"
for c in ts_text ts_sql ts_future; do expect_usage_error "'timestamp' must be a UTC time" import --db "$tmp/fixture.db" "$tmp/$c.json"; done
expect_usage_error "gives the key 'results' twice" import --db "$tmp/fixture.db" "$tmp/dupkey.json"
mkdir -p "$tmp/inputs"
expect_usage_error "input files would be over" run --family naive --params THREADS=128 --shape 1048576,65536,1048576,1048576,64 --inputs "$tmp/inputs"
expect_usage_error "input files would be over" run --family naive --params THREADS=128 --shape 1048576,4096,1048576,1048576,64 --inputs "$tmp/inputs"

# Small inputs, large costs: a grid of billions of problems from a few KB, refused before expansion.
python3 -c "
import json
n = 735134400  # 1344 divisors: every one a sequence length and a head dim
d = [k for k in range(1, 40000) if n % k == 0] + [n // k for k in range(1, 40000) if n % k == 0 and n // k >= 40000]
print(json.dumps({'grid': {'tokens': n, 'hidden': n, 'seq': d, 'head_dim': d, 'causal': [False, True],
                           'dtype': ['fp32', 'fp16', 'bf16']}}))" >"$tmp/grid_big.json"
cases=$((cases + 1))
limited timeout 20 "$F" problems "$tmp/grid_big.json" >/dev/null 2>"$tmp/err"; rc=$?
[[ $rc -eq 2 ]] && grep -q "more than 100000" "$tmp/err" || { echo "FAIL: a huge grid: rc=$rc $(head -c 200 "$tmp/err")"; fail=1; }
python3 -c "import json; print(json.dumps({'problems': [{'batch': 1, 'heads': 1, 'seq': 8, 'head_dim': 64}] * 100001}))" >"$tmp/many.json"
expect_usage_error "lists more than 100000 problems" problems "$tmp/many.json"
# A million distinct values take linear time to deduplicate (then the domain refuses them), in a space or a grid.
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
json.dump({"family": "naive", "params": {"THREADS": list(range(1, 1000001))}}, open(t + "/distinct.json", "w"))
json.dump({"family": "naive", "head_dims": list(range(1000000, 0, -1))}, open(t + "/distinct_d.json", "w"))
json.dump({"grid": {"tokens": 1 << 20, "hidden": 64, "seq": list(range(1, 1000001)), "head_dim": [64], "causal": [False],
                    "dtype": ["fp32"]}}, open(t + "/grid_distinct.json", "w"))
PY
bounded() { ft_run=(limited timeout "$1"); shift; expect_usage_error "$@"; ft_run=(); }
bounded 20 "parameter THREADS" compile-check "$tmp/distinct.json" --arch sm_80
bounded 20 "head_dim" compile-check "$tmp/distinct_d.json" --arch sm_80
bounded 20 "grid" problems "$tmp/grid_distinct.json"
# Packed rows whose few bytes of text describe 65,535 sequences each: 20,000 of them would take 10 GB to read.
# Every verb that reads results refuses past kMaxResultLengths, in bounded memory and time; 200 such rows
# (26 million lengths) are still read. The runtime's FLASHTUNE_DB: FakeDriver.SecondUserPlantsCacheEntriesAndWal.
"$F" export --db "$tmp/fixture.db" --format t4 -o "$tmp/fixture.t4.json" || { echo "FAIL: export for the packed cases"; fail=1; }
python3 - "$tmp" <<'PY'
import copy, json, shutil, sqlite3, sys
t = sys.argv[1]
vl = {"lengths": "fixed", "length": 1, "total_tokens": 65535}
for name, n in (("packed", 20000), ("packed_ok", 200)):
    shutil.copy(t + "/fixture.db", t + f"/{name}.db")
    c = sqlite3.connect(t + f"/{name}.db")
    cols = [r[1] for r in c.execute("pragma table_info(results)") if r[1] != "id"]
    row = dict(zip(cols, c.execute(f"select {','.join(cols)} from results where status='ok' limit 1").fetchone()))
    rows = [dict(row, kernel_hash=f"packed{i}", varlen=json.dumps(vl, separators=(",", ":")), batch=65535, seq_q=1, seq_k=1)
            for i in range(n)]
    c.executemany(f"insert into results({','.join(cols)}) values({','.join('?' * len(cols))})",
                  [tuple(r[k] for k in cols) for r in rows])
    c.commit()
d = json.load(open(t + "/fixture.t4.json"))
ok = next(r for r in d["results"] if r["flashtune"]["status"] == "ok")
ok["configuration"], ok["flashtune"]["family"] = {"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2}, "fa2_mma"
ok["flashtune"]["problem"] = {"heads": 1, "head_dim": 64, "dtype": "bf16", "causal": False, "direction": "fwd", "varlen": vl}
d["results"] = [dict(copy.deepcopy(ok), flashtune=dict(ok["flashtune"], kernel_hash=f"k{i}")) for i in range(20000)]
json.dump(d, open(t + "/packed.t4.json", "w"))
PY
bounded 60 "sequence lengths in all" best --db "$tmp/packed.db"
bounded 60 "sequence lengths in all" best --db "$tmp/packed.db" --csv --family fa2_simt
bounded 60 "sequence lengths in all" export --db "$tmp/packed.db" -o "$tmp/packed.json"
bounded 60 "sequence lengths in all" emit --db "$tmp/packed.db" --out "$tmp/packed_headers"
bounded 60 "sequence lengths in all" merge "$tmp/packed.db" -o "$tmp/packed_merged.db"
bounded 60 "sequence lengths in all" import --db "$tmp/packed_import.db" "$tmp/packed.t4.json"
bounded 60 "sequence lengths in all" report --db "$tmp/packed.db" --out "$tmp/packed_report"
ok "no store or output from the refused packed reads" \
  bash -c "! ls '$tmp'/packed.json '$tmp'/packed_headers '$tmp'/packed_merged.db '$tmp'/packed_import.db '$tmp'/packed_report 2>/dev/null | grep -q ."
cases=$((cases + 1))
if ! limited timeout 120 "$F" best --db "$tmp/packed_ok.db" --csv >"$tmp/out" 2>"$tmp/err" || [[ $(grep -c 'total_tokens' "$tmp/out") -lt 1 ]]; then
  echo "FAIL: best on 200 packed rows: $(head -c 300 "$tmp/err")"; fail=1
fi

# Streaming reads (issue 34). A T4 file is checked and copied result by result, never held whole (its parse took
# 12 times its size): 24,000 results (20 MB) are imported, and the same with a bad last result refused with the
# store unchanged, each in 250 MB of address space (the program alone maps some 130 MB; the whole-file parse
# aborts there); one result over 4 MiB, or a string over 4 MiB, is refused.
# The runtime's lookup reads only the rows of its query (SQL: family, device, dtype, direction, head dim, mask,
# no packed rows) and refuses more than 100,000 of them before reading one: tests/lookup_probe does what a call
# does with $FLASHTUNE_DB.
capped() {  # capped KB CMD...: CMD in KB of address space (under ASan, of resident memory, plus its own)
  local kb=$1; shift
  if [[ "${FT_SANITIZE:-}" == *address* ]]; then
    # (ASan's quarantine keeps up to 256 MB of freed memory resident by default: 16 MB here, so that what is
    # measured is the program's own memory. A 20 MB import takes 99 MB so, 640 MB with the default.)
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=$((kb / 1024 + 200)):quarantine_size_mb=16" "$@"
  else
    (ulimit -v "$kb"; "$@")
  fi
}
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
d = json.load(open(t + "/fixture.t4.json"))
ok = next(r for r in d["results"] if r["flashtune"]["status"] == "ok")
head = json.dumps({k: v for k, v in d.items() if k != "results"})[:-1] + ',"results":[\n'
def write(name, n, last=None):
    with open(t + "/" + name, "w") as f:
        f.write(head)
        for i in range(n):
            r = dict(ok, flashtune=dict(ok["flashtune"], kernel_hash=f"huge{i}"))
            if i == n - 1 and last: last(r)
            f.write(("," if i else "") + json.dumps(r, separators=(",", ":")) + "\n")
        f.write("]}\n")
write("huge.t4.json", 24000)
write("huge_bad.t4.json", 24000, lambda r: r["flashtune"].update(kernel_hash=""))
write("big_result.t4.json", 2, lambda r: r["flashtune"].update(detail={"x": [0] * 2500000}))
write("big_string.t4.json", 2, lambda r: r["flashtune"].update(error="x" * 5000000))
PY
cases=$((cases + 1))
if ! capped 250000 timeout 60 "$F" import --db "$tmp/huge_import.db" "$tmp/huge.t4.json" >"$tmp/out" 2>"$tmp/err" ||
   ! grep -q "24000 results, +24000" "$tmp/out"; then
  echo "FAIL: a 20 MB T4 file in 250 MB: $(head -c 300 "$tmp/err")"; fail=1
fi
ft_run=(capped 250000 timeout 60)
expect_usage_error "results[23999]: flashtune.kernel_hash must be a non-empty string" import --db "$tmp/fixture.db" "$tmp/huge_bad.t4.json"
expect_usage_error "results[1] is larger than 4 MiB" import --db "$tmp/fixture.db" "$tmp/big_result.t4.json"
expect_usage_error "holds a string or number longer than 4 MiB" import --db "$tmp/fixture.db" "$tmp/big_string.t4.json"
ft_run=()
rm -f "$tmp"/huge*.t4.json "$tmp"/big_*.t4.json "$tmp/huge_import.db"
python3 - "$tmp" <<'PY'
import json, shutil, sqlite3, sys
t = sys.argv[1]
vl = json.dumps({"lengths": "fixed", "length": 1, "total_tokens": 65535}, separators=(",", ":"))
for name, n, packed in (("rows_many", 100001, 0), ("rows_ok", 20000, 20000)):
    shutil.copy(t + "/fixture.db", t + f"/{name}.db")
    c = sqlite3.connect(t + f"/{name}.db")
    cols = [r[1] for r in c.execute("pragma table_info(results)") if r[1] != "id"]
    row = dict(zip(cols, c.execute(f"select {','.join(cols)} from results where status='ok' and family='fa2_simt' and "
                                   "device_name='NVIDIA H100 80GB HBM3' and head_dim=64 and causal=0 limit 1").fetchone()))
    rows = [dict(row, kernel_hash=f"many{i}", batch=1 + i // 64, seq_q=128 * (1 + i % 64), seq_k=128 * (1 + i % 64))
            for i in range(n)]
    rows += [dict(row, kernel_hash=f"packed{i}", varlen=vl, batch=65535, seq_q=1, seq_k=1) for i in range(packed)]
    c.executemany(f"insert into results({','.join(cols)}) values({','.join('?' * len(cols))})",
                  [tuple(r[k] for k in cols) for r in rows])
    c.commit()
PY
probe=("$LOOKUP_PROBE" "NVIDIA H100 80GB HBM3" sm_90 fwd fp32 64 0 4096)
cases=$((cases + 1))
FLASHTUNE_DB="$tmp/rows_many.db" capped 250000 timeout 20 "${probe[@]}" >"$tmp/out" 2>"$tmp/err"; rc=$?
if [[ $rc -ne 2 || $(wc -l <"$tmp/err") -ne 1 ]] || ! grep -q "holds more than 100000 results rows of fa2_simt" "$tmp/err"; then
  echo "FAIL: the runtime's lookup in a store of 100,001 rows of one query: rc=$rc $(head -c 300 "$tmp/err")"; fail=1
fi
cases=$((cases + 1))
if ! FLASHTUNE_DB="$tmp/rows_ok.db" capped 250000 timeout 20 "${probe[@]}" >"$tmp/out" 2>"$tmp/err" ||
   ! grep -q "^fa2_simt .* db$" "$tmp/out"; then
  echo "FAIL: the runtime's lookup in 20,000 rows and 20,000 packed ones: $(head -c 300 "$tmp/out" "$tmp/err")"; fail=1
fi
rm -f "$tmp/rows_many.db" "$tmp/rows_ok.db"

# Stores too large to read (issue 34): a read of a store (best, emit, export, merge, run --best, tune's resume) holds
# at most 250,000 rows, 256 MiB of stored text, 4 MiB in one results text cell and 64 MiB in any one value (SQLite's
# length limit: a cell of a GB is refused before SQLite allocates it), counted before the work; merge reads each
# input twice (checked, then copied) and holds one input at a time. Past a bound: one line, exit 2, in bounded
# memory and time, nothing written (fixture.db is every merge's output, and checked after each case).
python3 - "$tmp" <<'PY'
import shutil, sqlite3, sys
t = sys.argv[1]
c0 = sqlite3.connect(t + "/fixture.db")
cols = [r[1] for r in c0.execute("pragma table_info(results)") if r[1] != "id"]
c0.close()
def store(name, *sql):
    shutil.copy(t + "/fixture.db", t + f"/{name}.db")
    c = sqlite3.connect(t + f"/{name}.db")
    for q in sql: c.execute(q)
    c.commit(); c.close()
def copies(n, **over):  # n copies of an ok fa2_simt row, kernel_hash made unique, columns set by SQL expressions
    over.setdefault("kernel_hash", "'big' || i")
    return (f"insert into results({','.join(cols)}) with recursive n(i) as (select 1 union all select i + 1 from n where i < {n}) "
            f"select {','.join(over.get(k, 'r.' + k) for k in cols)} from n, "
            "(select * from results where status='ok' and family='fa2_simt' limit 1) r")
store("rows_over", copies(250001))
store("cell_big", copies(1, source_hash="hex(zeroblob(2500000))"))          # 5,000,000 bytes
store("cell_huge", copies(1, source_hash="hex(zeroblob(36000000))"))        # 72,000,000 bytes
store("text_over", copies(70, source_hash="hex(zeroblob(1950000))"))        # 70 x 3,900,000 bytes
store("exp_rows", "insert into experiment_runs(experiment,title,device_name,probes,spec,created) values('big','t','d','{}','{}','now')",
      "insert into experiment_rows(run_id,impl,direction,dtype,batch,heads,seq_q,seq_k,head_dim,causal,status) "
      "with recursive n(i) as (select 1 union all select i + 1 from n where i < 250001) "
      "select (select max(id) from experiment_runs),'x','fwd','fp32',1,1,8,8,64,0,'ok' from n")
store("exp_spec", "insert into experiment_runs(experiment,title,device_name,probes,spec,created) "
      "values('big','t','d','{}',hex(zeroblob(36000000)),'now')")
store("prov_rows", "insert into provenance(kind,source,content_hash,created) "
      "with recursive n(i) as (select 1 union all select i + 1 from n where i < 250001) select 'merge','/x','h' || i,'now' from n")
store("cubin_huge", "insert into kernels(hash,family,direction,config,head_dim,causal,dtype,arch,nvrtc_version,options,"
      "source_hash,name_expression,status,cubin,created) values('big','fa2_simt','fwd','BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,"
      "KV_STAGES=2',64,0,'fp32','sm_90','13.0','','src','x','compiled',zeroblob(70000000),'now')")
store("devices_over", copies(4097, device_name="'GPU ' || i"))
PY
for verb in "best --db $tmp/rows_over.db" "best --db $tmp/rows_over.db --csv --family fa2_simt" "export --db $tmp/rows_over.db" \
            "export --db $tmp/rows_over.db -o $tmp/big.json" "emit --db $tmp/rows_over.db --out $tmp/big_headers" \
            "merge $tmp/rows_over.db -o $tmp/fixture.db"; do
  bounded 60 "results rows would pass 250000 rows, the most" $verb
done
for verb in best export emit merge report; do
  args=(--db "@DB@"); [[ $verb == emit ]] && args+=(--out "$tmp/big_headers"); [[ $verb == merge ]] && args=("@DB@" -o "$tmp/fixture.db")
  [[ $verb == report ]] && args+=(--out "$tmp/big_report")
  bounded 60 "its source_hash is 5000000 bytes, over the 4 MiB one stored text may hold" $verb "${args[@]/@DB@/$tmp/cell_big.db}"
  bounded 60 "holds a value over 64 MiB" $verb "${args[@]/@DB@/$tmp/cell_huge.db}"
  bounded 60 "results rows would pass 256 MiB of stored text" $verb "${args[@]/@DB@/$tmp/text_over.db}"
done
bounded 60 "experiment rows would pass 250000 rows, the most merge's read of one input holds" merge "$tmp/exp_rows.db" -o "$tmp/fixture.db"
bounded 60 "results rows would pass 250000 rows" report --db "$tmp/rows_over.db" --out "$tmp/big_report"
bounded 60 "experiment rows would pass 250000 rows, the most one read holds" report --db "$tmp/exp_rows.db" --out "$tmp/big_report"
bounded 60 "holds a value over 64 MiB" report --db "$tmp/exp_spec.db" --out "$tmp/big_report"
bounded 60 "holds a value over 64 MiB" merge "$tmp/exp_spec.db" -o "$tmp/fixture.db"
bounded 60 "provenance rows would pass 250000 rows" merge "$tmp/prov_rows.db" -o "$tmp/fixture.db"
bounded 60 "holds a value over 64 MiB" merge "$tmp/cubin_huge.db" -o "$tmp/fixture.db"
devices_sum=$(sha256sum <"$tmp/devices_over.db")
bounded 60 "its results name more than 4096 devices" merge "$tmp/fixture.db" -o "$tmp/devices_over.db"
bounded 60 "its results name more than 4096 devices" import --db "$tmp/devices_over.db" "$tmp/t4.json"
ok "the store of 4097 devices is unchanged" test "$(sha256sum <"$tmp/devices_over.db")" == "$devices_sum"
ok "no output from the refused large reads" \
  bash -c "! ls -d '$tmp'/big.json* '$tmp'/big_headers 2>/dev/null | grep -q . && ! ls -A '$tmp'/big_report 2>/dev/null | grep -q ."
rm -f "$tmp"/{rows_over,cell_big,cell_huge,text_over,exp_rows,exp_spec,prov_rows,cubin_huge,devices_over}.db

# Output injection: CSV quoting, no escape sequences on a terminal, no HTML or headings in REPORT.md.
cp "$tmp/fixture.db" "$tmp/inject.db"
python3 - "$tmp/inject.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("update results set device_name=? where device_name='NVIDIA H200'", ('Evil "GPU", <script>alert(1)</script> \x1b]0;owned\x07 $\\alpha$ | x',))
c.commit()
PY
cases=$((cases + 1))
"$F" best --db "$tmp/inject.db" --csv >"$tmp/inject.csv" 2>&1
python3 - "$tmp/inject.csv" <<'PY' || { echo "FAIL: best --csv of a hostile device name"; fail=1; }
import csv, sys
text = open(sys.argv[1], encoding="utf-8").read()
assert "\x1b" not in text and "\x07" not in text, "an escape sequence"
rows = list(csv.reader(text.splitlines()))
assert all(len(r) == len(rows[0]) for r in rows), "a row with the wrong field count"
assert any(r[0].startswith('Evil "GPU", <script>') for r in rows), "the device name is not one field"
PY
cases=$((cases + 1))
"$F" best --db "$tmp/inject.db" 2>&1 | grep -q $'\x1b' && { echo "FAIL: an escape sequence reached the terminal"; fail=1; }
cases=$((cases + 1))
if "$F" report --db "$tmp/inject.db" --out "$tmp/injrep" >/dev/null 2>"$tmp/err"; then
  grep -q "<script>\|"$'\x1b' "$tmp/injrep/REPORT.md" && { echo "FAIL: REPORT.md embeds HTML or escapes from a stored name"; fail=1; }
else
  echo "FAIL: report of hostile names: $(tail -1 "$tmp/err")"; fail=1
fi
cp "$tmp/fixture.db" "$tmp/nulls.db"
python3 - "$tmp/nulls.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
ids = [r[0] for r in c.execute("select id from results where status='ok' order by id")]
c.execute("update results set tflops=NULL where id=?", (ids[0],))
c.execute("update results set tflops=0, ms_median=0 where id=?", (ids[1],))
c.execute("update results set config='BLOCK_M=x' where id=?", (ids[2],))
c.execute("insert into experiment_runs(experiment,title,device_name,probes,spec,created) values('listy','# Title <b>', 'd', 'not json', '[1, 2]', 'now')")
c.execute("insert into experiment_runs(experiment,title,device_name,probes,spec,created) values('mathy','$\\\\frac{1}{0}$', 'd', '[]', '{\"plot\": \"compare\", \"description\": \"# heading\"}', 'now')")
c.commit()
PY
cases=$((cases + 1))
"$F" report --db "$tmp/nulls.db" --out "$tmp/nullrep" >/dev/null 2>"$tmp/err" || { echo "FAIL: report with NULL/zero TFLOP/s, a list spec, non-JSON probes: $(tail -1 "$tmp/err")"; fail=1; }
grep -q "^# heading\|<b>" "$tmp/nullrep/REPORT.md" 2>/dev/null && { echo "FAIL: REPORT.md has a heading or HTML from stored text"; fail=1; }

# Lax parsing: --shape and integer options written plainly, duplicate keys, experiment fields named.
for s in " 4,16,8,8,64" "+4,16,8,8,64" "4,+16,8,8,64" "4,16,8,8,0x40" "4,16,8,8,64 " "4,16,,8,64"; do
  expect_usage_error "--shape field" run --family naive --params THREADS=128 --shape "$s"
done
expect_usage_error "--seq-lens must be comma-separated integers" run --family fa2_mma --params BLOCK_M=128 --shape 32,128 --seq-lens " 12,+5" --dtype bf16
expect_usage_error "--d must be an integer" best --db "$tmp/fixture.db" --d " 64"
expect_usage_error "--d must be an integer" best --db "$tmp/fixture.db" --d "+64"
echo '{"family": "naive", "family": "fa2_simt", "head_dims": [64]}' >"$tmp/dupspace.json"
expect_usage_error "gives the key 'family' twice" compile-check "$tmp/dupspace.json"
echo '{"problems": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 64, "batch": 2}]}' >"$tmp/dupprob.json"
expect_usage_error "gives the key 'batch' twice" problems "$tmp/dupprob.json"
echo '{"name": "x", "name": "y", "problems": [], "implementations": ["naive"]}' >"$tmp/dupexp.json"
expect_usage_error "gives the key 'name' twice" experiment "$tmp/dupexp.json" --dry-run
for field in description plot; do
  echo "{\"name\": \"x\", \"$field\": [1], \"problems\": {\"problems\": [{\"batch\": 1, \"heads\": 1, \"seq\": 8, \"head_dim\": 64}]}, \"implementations\": [\"naive\"]}" >"$tmp/exptype.json"
  expect_usage_error "experiment: '$field' must be a string" experiment "$tmp/exptype.json" --dry-run
done
echo '{"name": "../x", "problems": {"problems": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 64}]}, "implementations": ["naive"]}' >"$tmp/expname.json"
expect_usage_error "must be 1..64 lower-case letters" experiment "$tmp/expname.json" --dry-run

# --- issue 34, variants of each class beyond its examples ------------------------------------------
# Outputs over inputs: a store's -wal, -shm and -journal are the store too (SQLite writes and reads them with
# it), however spelled and whether or not they exist yet; a T4, space or problems file may not be one.
cp "$tmp/fixture.db" "$tmp/comp.db"
comp_sum=$(sha256sum <"$tmp/comp.db")
mkdir -p "$tmp/compdir" && ln -sfn "$tmp" "$tmp/compdir/up"
for suffix in -wal -shm -journal; do
  for out in "$tmp/comp.db$suffix" "$tmp/./comp.db$suffix" "$tmp/compdir/up/comp.db$suffix"; do
    expect_usage_error "is the --db store (or a file SQLite keeps beside it)" export --db "$tmp/comp.db" -o "$out"
  done
  expect_usage_error "is the output too (or a file SQLite keeps beside it)" merge "$tmp/comp.db" -o "$tmp/comp.db$suffix"
  expect_usage_error "is the output too (or a file SQLite keeps beside it)" merge "$tmp/fixture.db" "$tmp/comp.db$suffix" -o "$tmp/comp.db"
  cp "$tmp/t4.json" "$tmp/comp.db$suffix"
  expect_usage_error "is the --db store itself (or a file SQLite keeps beside it)" import --db "$tmp/comp.db" "$tmp/comp.db$suffix"
  cp "$tmp/problems.json" "$tmp/comp.db$suffix"
  expect_usage_error "is the --db store (or a file SQLite keeps beside it)" tune "$tmp/space.json" "$tmp/comp.db$suffix" --db "$tmp/comp.db" --arch sm_80
  ok "comp.db$suffix (a problems file) unchanged" cmp -s "$tmp/problems.json" "$tmp/comp.db$suffix"
  rm -f "$tmp/comp.db$suffix"
done
# through a link to the store: SQLite keeps the journals beside the file it leads to
ln -sf "$tmp/comp.db" "$tmp/compdir/link.db"
expect_usage_error "is the --db store (or a file SQLite keeps beside it)" export --db "$tmp/compdir/link.db" -o "$tmp/comp.db-wal"
expect_usage_error "is the output too" merge "$tmp/compdir/link.db" -o "$tmp/comp.db-journal"
ok "no file made beside the store" test ! -e "$tmp/comp.db-wal" -a ! -e "$tmp/comp.db-shm" -a ! -e "$tmp/comp.db-journal"
ok "the store unchanged" test "$(sha256sum <"$tmp/comp.db")" == "$comp_sum"
# compile-check's cubins: never over the space file or the store, whatever the cubin's name leads to
lowered=$(sql "$tmp/cc.db" "select lowered_name from kernels where status='compiled' limit 1" | head -1)
if [[ -n "$lowered" ]]; then
  cp "$tmp/space.json" "$tmp/cc_space.json"
  rm -rf "$tmp/ccout" && mkdir -p "$tmp/ccout"
  ln -s "$tmp/cc_space.json" "$tmp/ccout/$lowered.cubin"
  expect_usage_error "is an input (the space file)" compile-check "$tmp/cc_space.json" --arch sm_80 --db "$tmp/cc.db" --save-cubins "$tmp/ccout"
  ok "the space file is not a cubin" cmp -s "$tmp/space.json" "$tmp/cc_space.json"
  rm -f "$tmp/ccout/$lowered.cubin" && ln -s "$tmp/cc.db-journal" "$tmp/ccout/$lowered.cubin"
  expect_usage_error "is an input (the --db store)" compile-check "$tmp/space.json" --arch sm_80 --db "$tmp/cc.db" --save-cubins "$tmp/ccout"
  ok "no cubin written as the store's journal" test ! -e "$tmp/cc.db-journal"
else
  echo "FAIL: no compiled kernel in cc.db"; fail=1
fi
# report: the store under any name report writes in --out (a link, a hard link) is never written over
for name in best.csv REPORT.md summary_x.png; do
  rm -rf "$tmp/replink" && mkdir -p "$tmp/replink"
  ln -s "$tmp/comp.db" "$tmp/replink/$name"
  expect_usage_error "it would overwrite the store" report --db "$tmp/comp.db" --out "$tmp/replink"
  rm -f "$tmp/replink/$name" && ln "$tmp/comp.db" "$tmp/replink/$name"
  expect_usage_error "it would overwrite the store" report --db "$tmp/comp.db" --out "$tmp/replink"
done
ok "the store written over by no report" test "$(sha256sum <"$tmp/comp.db")" == "$comp_sum"

# Lax parsing of the command line: an option twice (however spelled) or an argument a verb takes not.
expect_usage_error "--output is given twice" export --db "$tmp/fixture.db" -o "$tmp/a.json" -o "$tmp/b.json"
expect_usage_error "--output is given twice" export --db "$tmp/fixture.db" --output="$tmp/a.json" -o "$tmp/b.json"
expect_usage_error "--output is given twice" merge "$tmp/fixture.db" -o "$tmp/a.db" --output "$tmp/b.db"
expect_usage_error "--db is given twice" best --db "$tmp/fixture.db" --db "$tmp/comp.db"
expect_usage_error "--quiet is given twice" merge "$tmp/fixture.db" -o "$tmp/a.db" --quiet --quiet
expect_usage_error "--d is given twice" best --db "$tmp/fixture.db" --d 64 --d=128
expect_usage_error "--params is given twice" run --family naive --params THREADS=128 --params THREADS=256 --shape 1,1,8,8,64
ok "no output of the refused options" test ! -e "$tmp/a.json" -a ! -e "$tmp/b.json" -a ! -e "$tmp/a.db" -a ! -e "$tmp/b.db"
expect_usage_error "best takes no positional arguments, got 'extra'" best --db "$tmp/fixture.db" extra
expect_usage_error "emit takes no positional arguments" emit --db "$tmp/fixture.db" --out "$tmp/headers" "$tmp/fixture.db"
expect_usage_error "report takes no positional arguments" report --db "$tmp/fixture.db" --out "$tmp/posrep" -x
expect_usage_error "run takes no positional arguments" run --family naive --params THREADS=128 --shape 1,1,8,8,64 64
expect_usage_error "devices takes no positional arguments" devices 0
expect_usage_error "drop-cubins takes no positional arguments" drop-cubins --db "$tmp/fixture.db" "$tmp/comp.db"

# Numbers and times from another store: merge (and export) take the figures a T4 import takes, no more.
for change in "tflops=1e300" "tflops=20000" "tflops=-1" "ms_median=-2" "gbps=1e8" "ms_p80=9e99" "reps=-1" \
              "ms_median=0" "created='yesterday'" "created='2026-13-01T00:00:00Z'" "created='2026-11-28 10:05:00'"; do
  cp "$tmp/fixture.db" "$tmp/nums.db"
  sql "$tmp/nums.db" "update results set $change where id=(select min(id) from results where status='ok')" >/dev/null
  needle=${change%%=*}; [[ $change == ms_median=0 ]] && needle="ms_median must be above 0 for status ok"
  [[ $needle == created ]] && needle="is not a UTC time"
  expect_usage_error "$needle" merge "$tmp/nums.db" -o "$tmp/fixture.db"
  expect_usage_error "$needle" export --db "$tmp/nums.db"
done
python3 - "$tmp/nums.db" <<'PY'  # an infinity SQLite holds as a real
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("update results set created='2026-01-01T00:00:00Z', tflops=?, ms_median=1 where id=(select min(id) from results where status='ok')", (float("inf"),))
c.commit()
PY
expect_usage_error "tflops" merge "$tmp/nums.db" -o "$tmp/fixture.db"
for ts in "2026-02-30T25:00:00Z" "2026-11-28T10:05:00" "2026-11-28T10:05:00.1234567890Z"; do
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); d['results'][0]['timestamp'] = sys.argv[3]; json.dump(d, open(sys.argv[2], 'w'))" "$tmp/t4.json" "$tmp/ts.json" "$ts"
  expect_usage_error "'timestamp' must be a UTC time" import --db "$tmp/fixture.db" "$tmp/ts.json"
done

# Stored text: NUL would cut a header's device name short (to another device's), C1 controls reach a terminal.
cp "$tmp/fixture.db" "$tmp/nul.db"
sql "$tmp/nul.db" "update results set device_name=cast(x'4e5649444941204831303020383047422048424d33006576696c' as text) where device_name='NVIDIA H200'" >/dev/null
expect_usage_error "device name holds control characters" emit --db "$tmp/nul.db" --out "$tmp/nulh"
expect_usage_error "holds control characters" merge "$tmp/nul.db" -o "$tmp/fixture.db"
ok "no header folder from a refused emit" test ! -e "$tmp/nulh/dispatch.hpp"
cp "$tmp/fixture.db" "$tmp/c1.db"
python3 -c "
import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute('update results set device_name=? where device_name=?', ('GPU \u009b2J\u009d0;x', 'NVIDIA H200')); c.commit()" "$tmp/c1.db"
expect_usage_error "holds control characters" merge "$tmp/c1.db" -o "$tmp/fixture.db"
expect_usage_error "device name holds control characters" emit --db "$tmp/c1.db" --out "$tmp/c1h"
for args in "" "--csv"; do
  cases=$((cases + 1))
  "$F" best --db "$tmp/c1.db" $args >"$tmp/out" 2>&1
  LC_ALL=C grep -q $'\xc2[\x80-\x9f]\|\x07\|\x1b' "$tmp/out" && { echo "FAIL: best $args printed a control character"; fail=1; }
done

# WAL stores: emit leaves nothing beside one; changes left in a -wal (a killed writer) in a folder the reader
# cannot write: one line, exit 2, nothing made there.
cp "$tmp/wal.db" "$tmp/walemit.db"
cases=$((cases + 1))
"$F" emit --db "$tmp/walemit.db" --out "$tmp/walemit_h" >/dev/null 2>&1 || { echo "FAIL: emit of a WAL store"; fail=1; }
[[ ! -e "$tmp/walemit.db-wal" && ! -e "$tmp/walemit.db-shm" ]] || { echo "FAIL: emit left -wal/-shm beside the store"; fail=1; }
if [[ ${#as_other[@]} -gt 0 ]]; then
  ro2=$(mktemp -d)
  planted+=("$ro2")
  chmod 755 "$ro2"
  cp "$tmp/fixture.db" "$ro2/w.db"
  python3 - "$ro2/w.db" <<'PY'
import os, shutil, sqlite3, sys
db = sys.argv[1]
c = sqlite3.connect(db); c.execute("pragma journal_mode=wal"); c.close()
c = sqlite3.connect(db); c.execute("pragma wal_autocheckpoint=0")
c.execute("delete from results where device_name = 'NVIDIA H200'"); c.commit()
shutil.copy(db + "-wal", db + ".wal"); shutil.copy(db, db + ".main")
os._exit(0)  # killed: the -wal keeps the changes
PY
  mv "$ro2/w.db.main" "$ro2/w.db" && mv "$ro2/w.db.wal" "$ro2/w.db-wal" && rm -f "$ro2/w.db-shm"
  chmod 444 "$ro2"/* && chmod 555 "$ro2"
  for verb in "best --db $ro2/w.db" "export --db $ro2/w.db" "emit --db $ro2/w.db --out $tmp/ro2h" "report --db $ro2/w.db --out $tmp/ro2rep"; do
    cases=$((cases + 1))
    "${as_other[@]}" "$F" $verb >/dev/null 2>"$tmp/err"; rc=$?
    [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "has changes in its -wal file" "$tmp/err" ||
      { echo "FAIL: $verb with changes in a read-only folder's -wal: rc=$rc $(head -c 200 "$tmp/err")"; fail=1; }
  done
  ok "nothing made in the read-only folder" test "$(ls "$ro2" | tr '\n' ' ')" == "w.db w.db-wal "
  cases=$((cases + 1))  # where the folder can be written (root's), the changes are read: no H200 row left
  if "$F" best --db "$ro2/w.db" --csv >"$tmp/out" 2>"$tmp/err"; then
    grep -q "NVIDIA H200" "$tmp/out" && { echo "FAIL: best read the store without the changes in its -wal"; fail=1; }
    grep -q "NVIDIA H100" "$tmp/out" || { echo "FAIL: best of a store with changes in its -wal read nothing"; fail=1; }
  else
    echo "FAIL: best of a store with changes in its -wal: $(head -c 200 "$tmp/err")"; fail=1
  fi
fi

# --- the worker log: never a predictable path, never through a planted link -------------------
mkdir -p "$tmp/tmpdir"
for p in $(seq $$ $(($$ + 400))); do
  l=/tmp/flashtune-worker-$p-0.log
  [[ -e "$l" || -L "$l" ]] && continue
  ln -s "$tmp/victim" "$l" 2>/dev/null && planted+=("$l")
done
cases=$((cases + 1))
TMPDIR="$tmp/tmpdir" "$F" devices >/dev/null 2>&1
[[ -e "$tmp/victim" ]] && { echo "FAIL: the worker log followed a planted symlink"; fail=1; }
[[ -z "$(ls -A "$tmp/tmpdir")" ]] || { echo "FAIL: private worker folder left behind: $(ls -A "$tmp/tmpdir")"; fail=1; }

# --- concurrent writers on a new store: all finish, nothing doubled ---------------------------
python3 -c "
import json
print(json.dumps({'problems': [{'batch': 1, 'heads': 2, 'seq': 64, 'head_dim': d, 'causal': c}
                               for d in (32, 64, 96, 128) for c in (False, True)]}))" >"$tmp/all.json"
cases=$((cases + 1))
pids=()
for i in 1 2 3 4 5 6; do
  "$F" tune "$NAIVE" "$tmp/all.json" --db "$tmp/conc.db" --arch sm_80 --quiet >"$tmp/conc$i.out" 2>"$tmp/conc$i.err" &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "FAIL: concurrent tune $i: $(grep -v 'no GPU' "$tmp/conc$((i + 1)).err" | head -2)"; fail=1; }
done
[[ "$(sql "$tmp/conc.db" "select count(*), count(distinct hash) from kernels")" == "16|16" ]] ||
  { echo "FAIL: concurrent kernels: $(sql "$tmp/conc.db" "select count(*), count(distinct hash) from kernels")"; fail=1; }
[[ "$(sql "$tmp/conc.db" "select count(*) from (select 1 from results group by kernel_hash, device_name, sm_count, batch, heads, seq_q, seq_k, inputs having count(*) > 1)")" == 0 ]] ||
  { echo "FAIL: doubled results"; fail=1; }

# --- kill -9 mid-sweep, then resume: complete, nothing doubled, the file intact ---------------
cases=$((cases + 1))
# (TMPDIR inside $tmp: a killed process cannot remove its private worker folder)
TMPDIR="$tmp/tmpdir" "$F" tune "$NAIVE" "$tmp/all.json" --db "$tmp/kill.db" --arch sm_80 --quiet >/dev/null 2>&1 &
kpid=$!
sleep 0.4
kill -9 $kpid 2>/dev/null
wait $kpid 2>/dev/null
before_resume=$(sql "$tmp/kill.db" "select count(*) from kernels" 2>/dev/null || echo 0)
"$F" tune "$NAIVE" "$tmp/all.json" --db "$tmp/kill.db" --arch sm_80 --quiet >/dev/null 2>&1 || { echo "FAIL: resume after kill -9"; fail=1; }
[[ "$(sql "$tmp/kill.db" "pragma integrity_check")" == ok ]] || { echo "FAIL: store damaged by kill -9"; fail=1; }
[[ "$(sql "$tmp/kill.db" "select count(*), count(distinct hash), sum(status in ('compiled','pruned')) from kernels")" == "16|16|16" ]] ||
  { echo "FAIL: after resume: $(sql "$tmp/kill.db" "select count(*), count(distinct hash) from kernels") (had $before_resume)"; fail=1; }

echo "hostile_inputs: $cases cases"
[[ $fail -eq 0 ]] && echo "hostile_inputs: all passed"
exit $fail
