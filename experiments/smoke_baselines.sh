#!/usr/bin/env bash
# Device smoke test of the Python baselines: the no-GPU unit test, triton_fa's own float64 self-check,
# then every impl of experiments/baselines.py on a tiny problem list (fp32/bf16/fp16, fwd/bwd, causal and
# not, Sq != Sk both ways, d 32/64/96/128/256, and one problem too large for any GPU, which must come
# back as "oom" without stopping the run). Prints the rows compactly; files go to $1 (default
# $OUT/smoke_baselines, else /tmp/smoke_baselines).
#
# usage: bash experiments/smoke_baselines.sh [OUTDIR]
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}/smoke_baselines}
mkdir -p "$out"

echo "== tests/test_baselines_py.py"
python3 tests/test_baselines_py.py 2>&1 | tail -3
echo "== experiments/triton_fa.py self-check (O max_abs, gradient rel L2 vs float64)"
timeout 240 python3 experiments/triton_fa.py 2>&1 | tail -40

cat >"$out/problems.json" <<'EOF'
[
 {"batch": 1, "heads": 2, "seq_q": 128, "seq_k": 128, "head_dim": 64,  "dtype": "fp32", "causal": false, "direction": "fwd"},
 {"batch": 2, "heads": 3, "seq_q": 100, "seq_k": 300, "head_dim": 96,  "dtype": "fp32", "causal": true,  "direction": "fwd"},
 {"batch": 1, "heads": 2, "seq_q": 128, "seq_k": 128, "head_dim": 64,  "dtype": "fp32", "causal": true,  "direction": "bwd"},
 {"batch": 1, "heads": 3, "seq_q": 77,  "seq_k": 200, "head_dim": 128, "dtype": "fp32", "causal": false, "direction": "bwd"},
 {"batch": 2, "heads": 4, "seq_q": 256, "seq_k": 256, "head_dim": 128, "dtype": "bf16", "causal": true,  "direction": "fwd"},
 {"batch": 64, "heads": 64, "seq_q": 65536, "seq_k": 65536, "head_dim": 128, "dtype": "fp16", "causal": false, "direction": "fwd"},
 {"batch": 1, "heads": 2, "seq_q": 300, "seq_k": 100, "head_dim": 96,  "dtype": "bf16", "causal": true,  "direction": "fwd"},
 {"batch": 1, "heads": 2, "seq_q": 1000, "seq_k": 1000, "head_dim": 64, "dtype": "bf16", "causal": false, "direction": "fwd"},
 {"batch": 2, "heads": 2, "seq_q": 256, "seq_k": 256, "head_dim": 64,  "dtype": "bf16", "causal": false, "direction": "bwd"},
 {"batch": 1, "heads": 3, "seq_q": 130, "seq_k": 513, "head_dim": 128, "dtype": "bf16", "causal": true,  "direction": "bwd"},
 {"batch": 1, "heads": 2, "seq_q": 200, "seq_k": 200, "head_dim": 96,  "dtype": "bf16", "causal": true,  "direction": "bwd"},
 {"batch": 1, "heads": 2, "seq_q": 200, "seq_k": 200, "head_dim": 256, "dtype": "fp16", "causal": false, "direction": "fwd"},
 {"batch": 1, "heads": 2, "seq_q": 256, "seq_k": 256, "head_dim": 256, "dtype": "fp16", "causal": true,  "direction": "bwd"},
 {"batch": 2, "heads": 2, "seq_q": 192, "seq_k": 192, "head_dim": 32,  "dtype": "fp16", "causal": true,  "direction": "bwd"},
 {"batch": 1, "heads": 2, "seq_q": 256, "seq_k": 256, "head_dim": 256, "dtype": "fp32", "causal": true,  "direction": "bwd"}
]
EOF

for impl in triton torch_math torch_efficient torch_flash torch_cudnn torch_cpu; do
  echo "== $impl"
  timeout 600 python3 experiments/baselines.py --impl "$impl" --problems "$out/problems.json" \
    --out "$out/rows_$impl.jsonl" --reps 5 --rows 256 2>"$out/log_$impl.txt"
  rc=$?
  [ $rc -ne 0 ] && { echo "   exit $rc; last log lines:"; tail -5 "$out/log_$impl.txt"; }
  python3 - "$out/rows_$impl.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "experiments")
from baselines import ROW_KEYS
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
for r in rows:
    keys = [k for k in r if k != "detail"]
    bad_keys = "" if keys == list(ROW_KEYS) else " KEYS DIFFER"
    prob = f"{r['direction']} {r['dtype']} B{r['batch']} H{r['heads']} {r['seq_q']}x{r['seq_k']} d{r['head_dim']}{' c' if r['causal'] else ''}"
    det = r.get("detail")
    det = " rl2 " + "/".join(f"{det[k]:.1e}" for k in ("dq_rel_l2", "dk_rel_l2", "dv_rel_l2")) if det else ""
    print(f"   {prob:<38} {r['status']:<11} {r['ms_median']:8.4f}ms {r['tflops']:7.2f}TF max_abs {r['max_abs']:.1e} "
          f"max_rel {r['max_rel']:.1e} peak {r['peak_bytes'] / 2**20:7.1f}MiB{det}{bad_keys} "
          f"{r['config'][:40]} {r['error'][:110]}")
print(f"   {len(rows)} rows; device: {rows[0]['device'] if rows else '-'}")
PY
done
