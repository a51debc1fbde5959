#!/usr/bin/env bash
# On a GPU: the search path of `tune` end to end.
# 1. halving with two workers on one GPU (--devices 0,0) into one store: every candidate evaluated,
#    no row lost or doubled, the finalists re-timed interleaved (detail.retime), --json per problem;
# 2. a rerun reuses every stored row;
# 3. guided with --max-evals 25% stays within it; exhaustive with early stopping records cut timings;
# 4. the fault family on two workers of one GPU: one worker's crash leaves the other going, the
#    sweep completes with every status stored.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat >"$tmp/p.json" <<'JSON'
{"problems": [{"batch": 2, "heads": 8, "seq_q": 1024, "seq_k": 1024, "head_dim": 64, "dtype": "bf16"},
              {"batch": 2, "heads": 8, "seq_q": 700, "seq_k": 1100, "head_dim": 64, "dtype": "bf16", "causal": true}]}
JSON
space="$SRC/configs/spaces/fa2_mma.json"
"$FLASHTUNE" tune "$space" "$tmp/p.json" --db "$tmp/a.db" --strategy halving --devices 0,0 --json --quiet \
  >"$tmp/a.json" 2>"$tmp/a.err" || { cat "$tmp/a.err"; fail "halving on --devices 0,0 exited non-zero"; }
python3 - "$tmp/a.json" "$tmp/a.db" <<'PY' || exit 1
import json, sqlite3, sys
reps = json.load(open(sys.argv[1]))
db = sqlite3.connect(sys.argv[2])
assert len(reps) == 2, reps
for r in reps:
    p = r["problem"]
    assert r["evaluations"] == r["space_size"] > 0, r
    assert r["best_found_tflops"] > 0 and r["best_config"], r
    n, distinct = db.execute("select count(*), count(distinct kernel_hash) from results where seq_q=? and causal=?",
                             (p["seq_q"], int(p["causal"]))).fetchone()
    assert n == distinct == r["space_size"], (n, distinct, r["space_size"])
    retimed = db.execute("select count(*) from results where seq_q=? and detail like '%\"retime\"%'", (p["seq_q"],)).fetchone()[0]
    assert retimed == 3, f"{retimed} rows re-timed, want 3"
    # One median: a re-timed row's median, p20 and p80 pool the same repeats of all its rounds.
    for med, lo, hi, reps_, det in db.execute("select ms_median, ms_p20, ms_p80, reps, detail from results where seq_q=? "
                                              "and detail like '%\"retime\"%'", (p["seq_q"],)):
        rt = json.loads(det)["retime"]
        assert 0 < lo <= med <= hi and rt["pooled"] == "repeats" and reps_ == rt["samples"] >= 10, (med, lo, hi, rt)
        assert "ms_samples" not in json.loads(det), "the pooled samples are not stored"
    # Halving's later rounds and the re-timing time a kernel this sweep validated: timed only, the
    # validated run's errors kept (detail.validation "reused", the per-output errors still there).
    for st, mx, det in db.execute("select status, max_abs, detail from results where seq_q=? and reps >= 8", (p["seq_q"],)):
        d = json.loads(det)
        assert st == "ok" and d.get("validation") == "reused", (st, d.get("validation"))
        assert mx > 0 and "worst_err_over_bound" in d and "timing" in d["phase_ms"] and "validate" not in d["phase_ms"], d
    print(f"halving {p['seq_q']}x{p['seq_k']} causal={p['causal']}: {r['evaluations']} evaluated, best {r['best_config']} "
          f"{r['best_found_tflops']:.1f} TFLOP/s, timing {r['timing_ms']:.0f} ms")
PY
"$FLASHTUNE" tune "$space" "$tmp/p.json" --db "$tmp/a.db" --strategy halving --json --quiet >"$tmp/b.json" 2>"$tmp/b.err" ||
  fail "rerun exited non-zero"
# Every candidate's stored row is reused; halving re-times only one whose stored row has fewer repeats
# than its round asks (its rounds see the stored figures, which may reorder the cut).
python3 -c "
import json, sys
first = {json.dumps(r['problem']): r for r in json.load(open(sys.argv[1]))}
for r in json.load(open(sys.argv[2])):
    assert r['reused'] == r['evaluations'], r
    assert r['timing_ms'] <= 0.25 * first[json.dumps(r['problem'])]['timing_ms'], r
print('rerun: every candidate reused')" "$tmp/a.json" "$tmp/b.json" || exit 1

"$FLASHTUNE" tune "$space" "$tmp/p.json" --db "$tmp/g.db" --strategy guided --max-evals 25% --seed 3 --json --quiet \
  >"$tmp/g.json" 2>"$tmp/g.err" || { cat "$tmp/g.err"; fail "guided exited non-zero"; }
python3 -c "
import json, sys
for r in json.load(open(sys.argv[1])):
    assert 0 < r['evaluations'] <= r['space_size'] // 4, r
    print(f\"guided: {r['evaluations']} of {r['space_size']} evaluated, best {r['best_config']} {r['best_found_tflops']:.1f} TFLOP/s\")
" "$tmp/g.json" || exit 1
"$FLASHTUNE" tune "$space" "$tmp/p.json" --db "$tmp/e.db" --stop-margin 0.1 --retime 0 --quiet 2>"$tmp/e.err" >/dev/null ||
  { cat "$tmp/e.err"; fail "exhaustive with early stop exited non-zero"; }
python3 - "$tmp/e.db" <<'PY' || exit 1
import json, sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select reps, detail from results where status='ok'").fetchall()
cut = [r for r in rows if json.loads(r[1] or "{}").get("early_stopped")]
assert rows and all(r[0] == 3 for r in cut), "an early-stopped row must hold its 3 repeats"
assert all("timing_ms" in json.loads(r[1]) for r in rows), "timing_ms missing from detail"
tel = [json.loads(r[1]).get("telemetry", {}) for r in rows]
assert all(t.get("sm_clock_mhz", 0) > 0 and "temperature_c" in t and "power_w" in t and "throttle" in t for t in tel), tel[:2]
print(f"telemetry with every timing, e.g. {tel[0]}")
print(f"early stop (margin 0.1): {len(cut)} of {len(rows)} timings cut after 3 repeats")
PY

cat >"$tmp/f.json" <<'JSON'
{"problems": [{"batch": 1, "heads": 2, "seq_q": 100, "seq_k": 130, "head_dim": 32},
              {"batch": 1, "heads": 2, "seq_q": 130, "seq_k": 100, "head_dim": 32, "causal": true}]}
JSON
"$FLASHTUNE" tune "$SRC/configs/spaces/fault.json" "$tmp/f.json" --db "$tmp/f.db" --devices 0,0 --timeout 5 --quiet \
  >"$tmp/f.out" 2>&1 || { cat "$tmp/f.out"; fail "fault sweep on two workers exited non-zero"; }
python3 - "$tmp/f.db" <<'PY' || exit 1
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select config, causal, status from results order by id").fetchall()
want = {"MODE=1": "crashed", "MODE=2": "timeout", "MODE=0": "ok"}
bad = [r for r in rows if want[r[0]] != r[2]]
if len(rows) != 6 or bad:
    sys.exit(f"FAIL: want 6 rows with statuses {want}, got {rows}")
print("fault family on two workers: crashed, timeout and ok all stored, the sweep completed")
PY
echo "gpu_search: passed"
