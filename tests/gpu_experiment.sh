#!/usr/bin/env bash
# On a GPU: `flashtune experiment` runs every implementation (our families, cuBLAS unfused, the Python
# baselines) on small ragged problems in one call, stores one row per applicable (impl, problem) with
# errors and peak memory, and the report draws it.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gpu"
"$FLASHTUNE" experiment "$SRC/tests/experiment_smoke.json" --db "$tmp/gpu/results.db" --quiet 2>"$tmp/log" \
  || { echo "FAIL: experiment"; tail -20 "$tmp/log"; exit 1; }
python3 - "$tmp/gpu/results.db" <<'PY' || exit 1
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
run, probes = c.execute("select id, probes from experiment_runs").fetchone()
rows = c.execute("select impl, dtype, direction, status, error, tflops, max_abs, peak_bytes from experiment_rows "
                 "where run_id=?", (run,)).fetchall()
for r in rows: print(*r)
print("probes", probes)
fail = []
# torch's flash/efficient/cuDNN backends may refuse a dtype or shape ("unsupported"); everything else must pass.
may_refuse = {"torch_flash", "torch_efficient", "torch_cudnn"}
for impl, dt, direction, status, error, tflops, max_abs, peak in rows:
    if status == "ok":
        if not (tflops > 0 and peak > 0 or impl == "torch_cpu"): fail.append(f"{impl} {dt} {direction}: tflops {tflops} peak {peak}")
    elif not (impl in may_refuse and status == "unsupported"):
        fail.append(f"{impl} {dt} {direction}: {status} {error}")
want = {"naive": 1, "fa1_simt": 1, "fa2_simt": 1, "fa2_mma": 1, "fa2_simt_bwd": 1, "fa2_mma_bwd": 1, "cublas_unfused": 2,
        "torch_math": 4, "torch_efficient": 4, "torch_flash": 2, "torch_cudnn": 4, "torch_cpu": 2, "triton": 4}
got = {}
for r in rows: got[r[0]] = got.get(r[0], 0) + 1
if got != want: fail.append(f"rows per impl {got}, want {want}")
if fail: sys.exit("FAIL: " + "; ".join(fail))
PY
"$FLASHTUNE" report --gpu gpu --reports "$tmp" >/dev/null || { echo "FAIL: report"; exit 1; }
grep -q "## Experiment: Every implementation" "$tmp/gpu/REPORT.md" || { echo "FAIL: REPORT.md section"; exit 1; }
echo "gpu_experiment: passed"
