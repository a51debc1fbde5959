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
# Above 0: a gradient read back short compared nothing and passed with 0 error (the worker's host buffers, 2026-11-29).
assert all(0 < d[g + "_rel_l2"] <= 1e-5 for g in ("dq", "dk", "dv")), d
PY
"$FLASHTUNE" run --family fa2_mma_bwd --params BLOCK_M=32,BLOCK_N=128,WARPS=4,DSPLIT=1,STAGES=2,DQ_MODE=1 \
  --shape 2,2,517,333,64 --dtype bf16 --causal --direction bwd --check-determinism --json \
  --save-outputs "$tmp/mbwd_out" >"$tmp/mbwd.json" || { echo "FAIL: fa2_mma_bwd run"; cat "$tmp/mbwd.json"; fail=1; }
python3 - "$tmp/mbwd.json" "$tmp/mbwd_out" <<'PY' || fail=1
import json, os, sys
r = json.load(open(sys.argv[1]))
print(r)
d = r["detail"]
assert r["status"] == "ok" and d["deterministic"] is True, r
assert all(0 < d[g + "_rel_l2"] <= 2e-2 for g in ("dq", "dk", "dv")) and r["max_abs"] > 0, d
# The validated outputs whole: B H S d bf16 each (a fresh worker's first read-back was 0 bytes, 2026-11-29).
sizes = {g: os.path.getsize(os.path.join(sys.argv[2], g + ".bin")) for g in ("dq", "dk", "dv")}
assert sizes == {"dq": 2 * 2 * 517 * 64 * 2, "dk": 2 * 2 * 333 * 64 * 2, "dv": 2 * 2 * 333 * 64 * 2}, sizes
PY
# Packed variable-length batches: every row of a ragged batch (a 1-token, an empty and a key-less sequence,
# GQA, causal per sequence), forward and backward, the packed outputs written everywhere (the NaN poison).
"$FLASHTUNE" run --family fa2_mma --params BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2 --shape 4,64 --heads-k 2 \
  --seq-lens 1,77,0,300,40 --seq-lens-k 1,77,5,301,0 --dtype bf16 --causal --check --check-determinism --json \
  >"$tmp/vl.json" || { echo "FAIL: fa2_mma varlen run"; cat "$tmp/vl.json"; fail=1; }
"$FLASHTUNE" run --family fa2_mma_bwd --params BLOCK_M=64,BLOCK_N=64,WARPS=4,DSPLIT=1,STAGES=2,DQ_MODE=1 --shape 4,64 \
  --heads-k 2 --seq-lens 1,77,0,300,40 --seq-lens-k 1,77,5,301,0 --dtype bf16 --causal --direction bwd \
  --check-determinism --json >"$tmp/vlb.json" || { echo "FAIL: fa2_mma_bwd varlen run"; cat "$tmp/vlb.json"; fail=1; }
python3 - "$tmp/vl.json" "$tmp/vlb.json" <<'PY' || fail=1
import json, sys
f, b = (json.load(open(p)) for p in sys.argv[1:])
print(f)
print(b)
assert f["status"] == "ok" and f["detail"]["validated_rows"] == 4 * 418 and f["detail"]["deterministic"] is True, f
assert f["problem"]["varlen"] == {"seq_lens": [1, 77, 0, 300, 40], "seq_lens_k": [1, 77, 5, 301, 0]}, f["problem"]
assert b["status"] == "ok" and b["detail"]["deterministic"] is True, b
PY
# Paged K/V caches: every row of a ragged cache (a sequence without keys, one of a single key, one a key past a
# page, causal Sq 3), split (a combine) and not, through the block table's seeded page order.
for params in SPLITS=16,BLOCK_N=64,WARPS=4,STAGES=2 SPLITS=1,BLOCK_N=32,WARPS=2,STAGES=1; do
  "$FLASHTUNE" run --family decode_splitkv --params "$params" --shape 4,8,3,300,128 --heads-k 2 --dtype bf16 --causal \
    --paged '{"page_size":64,"seed":5,"seq_lens_k":[300,0,1,65]}' --check --check-determinism --json >"$tmp/pg.json" \
    || { echo "FAIL: decode_splitkv paged run $params"; cat "$tmp/pg.json"; fail=1; }
  python3 - "$tmp/pg.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print(r)
assert r["status"] == "ok" and r["detail"]["validated_rows"] == 4 * 8 * 3 and r["detail"]["deterministic"] is True, r
assert r["problem"]["paged"] == {"page_size": 64, "seed": 5, "seq_lens_k": [300, 0, 1, 65]}, r["problem"]
PY
done
# --inputs / --save-outputs: inputs written by numpy, outputs compared with numpy's float64 attention
# (bottom-right causal), forward with fa2_simt and backward with fa2_simt_bwd, every head distinct.
python3 - "$tmp/in" <<'PY' || { echo "FAIL: writing inputs"; fail=1; }
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(7)
for name, s in (("q", 130), ("k", 200), ("v", 200), ("do", 130)):
    rng.standard_normal((2, 2, s, 64)).astype(np.float32).tofile(f"{d}/{name}.bin")
PY
cat >"$tmp/ref.py" <<'PY'
import sys
import numpy as np
B, H, Sq, Sk, D = 2, 2, 130, 200, 64
def load(path, s, dtype=np.float32, d=D):
    return np.fromfile(path, dtype=dtype).reshape(B, H, s, d).astype(np.float64)
def reference(d):  # float64 forward and backward, bottom-right causal, scale 1/sqrt(d)
    q, k, v, do = load(f"{d}/q.bin", Sq), load(f"{d}/k.bin", Sk), load(f"{d}/v.bin", Sk), load(f"{d}/do.bin", Sq)
    scale = 1 / np.sqrt(D)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s[..., np.arange(Sk)[None, :] > np.arange(Sq)[:, None] + (Sk - Sq)] = -np.inf
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / l
    o = p @ v
    lse = (np.log(l) + m)[..., 0]
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    return o, lse, ds @ k * scale, np.einsum("bhij,bhid->bhjd", ds, q) * scale, dv
PY
"$FLASHTUNE" run --family fa2_simt --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2 --shape 2,2,130,200,64 \
  --causal --inputs "$tmp/in" --save-outputs "$tmp/fwd_out" --check --json >"$tmp/fin.json" \
  || { echo "FAIL: fa2_simt run --inputs"; cat "$tmp/fin.json"; fail=1; }
python3 - "$tmp" <<'PY' || fail=1
import json, sys
sys.path.insert(0, sys.argv[1])
from ref import *
t = sys.argv[1]
r = json.load(open(f"{t}/fin.json"))
assert r["status"] == "ok" and r["detail"]["validated_rows"] == B * H * Sq and r["max_abs"] < 1e-4, r
o, lse, *_ = reference(f"{t}/in")
got_o, got_lse = load(f"{t}/fwd_out/o.bin", Sq), load(f"{t}/fwd_out/lse.bin", Sq, d=1)[..., 0]
err_o, err_lse = np.abs(got_o - o).max(), np.abs(got_lse - lse).max()
print(f"--inputs forward: o max abs {err_o:.3g} (harness {r['max_abs']:.3g}), lse max abs {err_lse:.3g}")
assert err_o < 1e-4 and err_lse < 1e-4, (err_o, err_lse)
PY
"$FLASHTUNE" run --family fa2_simt_bwd --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=2,DQ_MODE=1 --shape 2,2,130,200,64 \
  --causal --inputs "$tmp/in" --save-outputs "$tmp/bwd_out" --json >"$tmp/bin.json" \
  || { echo "FAIL: fa2_simt_bwd run --inputs"; cat "$tmp/bin.json"; fail=1; }
python3 - "$tmp" <<'PY' || fail=1
import json, sys
sys.path.insert(0, sys.argv[1])
from ref import *
t = sys.argv[1]
r = json.load(open(f"{t}/bin.json"))
d = r["detail"]
assert r["status"] == "ok" and d["distinct_heads"] == B * H, r
_, _, dq, dk, dv = reference(f"{t}/in")
for name, ref, s in (("dq", dq, Sq), ("dk", dk, Sk), ("dv", dv, Sk)):
    got = load(f"{t}/bwd_out/{name}.bin", s)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"--inputs backward: {name} rel L2 {rel:.3g} (harness {d[name + '_rel_l2']:.3g})")
    assert rel < 1e-5 and d[name + "_rel_l2"] < 1e-5, (name, rel, d)
    assert abs(rel - d[name + "_rel_l2"]) <= 0.05 * rel + 1e-9, (name, rel, d)  # the two references agree
PY
[[ $fail -eq 0 ]] && echo "gpu_run_cli: passed"
exit $fail
