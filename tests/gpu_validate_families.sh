#!/usr/bin/env bash
# On a GPU: every variant of every committed family space validates against the float64
# reference on ragged shapes (Sq != Sk, no tile divides, causal with fully masked rows), every head dim,
# every dtype of the family.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
db=${VALIDATE_DB:-$tmp/v.db}
fail=0
for pair in naive:ragged fa1_simt:ragged fa2_simt:ragged fa2_mma:ragged_mma fa2_simt_bwd:ragged_bwd fa2_mma_bwd:ragged_mma_bwd fa2_wgmma_bwd:ragged_mma_bwd; do
  space=${pair%%:*} problems=${pair##*:}
  "$FLASHTUNE" tune "$SRC/configs/spaces/$space.json" "$SRC/configs/problems/$problems.json" --db "$db" --quiet \
    || { echo "FAIL: tune $space"; fail=1; }
done
python3 - "$db" <<'PY' || fail=1
import sqlite3, sys, collections
c = sqlite3.connect(sys.argv[1])
rows = c.execute("select family, status, count(*) from results group by family, status").fetchall()
for r in rows: print(*r)
bad = c.execute("select family, config, head_dim, causal, seq_q, seq_k, status, error from results "
                "where status not in ('ok', 'pruned')").fetchall()
for b in bad[:20]: print("BAD", b)
ok = {f: n for f, s, n in rows if s == "ok"}
if bad or any(ok.get(f, 0) == 0 for f in ("naive", "fa1_simt", "fa2_simt", "fa2_mma", "fa2_simt_bwd", "fa2_mma_bwd", "fa2_wgmma_bwd")):
    sys.exit(f"FAIL: {len(bad)} candidates neither ok nor pruned")
PY
[[ $fail -eq 0 ]] && echo "gpu_validate_families: passed"
exit $fail
