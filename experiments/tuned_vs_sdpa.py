#!/usr/bin/env python3
"""Comparison on one GPU in one run: the tuned best config (re-timed, not the sweep's maximum),
for the forward also FlashAttention-2's (fa3_wgmma: FlashAttention-3's) fixed tile table run through our own template, and torch
SDPA's flash and cuDNN backends (forward, or backward alone), per point of a problem set. Writes one
CSV row per point with TFLOP/s and the ratios.

usage: tuned_vs_sdpa.py --db reports/<gpu>/results.db --problems configs/problems/anchors_bf16.json \
                        --out reports/<gpu>/fwd_vs_sdpa.csv [--family fa2_mma] [--flashtune build/flashtune]
       (--family fa3_wgmma: FlashAttention-3's fixed table instead, columns fa3_table_* and tuned_vs_fa3_table:
        reports/<gpu>/fwd_hopper_vs_peers.csv)
       (the direction comes from the problems; backward: --family fa2_wgmma_bwd,fa2_mma_bwd; with
        several families the best re-timed one per point is the tuned figure, named in tuned_family)
"""
import argparse
import csv
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdpa_baseline  # noqa: E402

# FlashAttention-2's hard-coded forward tiles (sm80 path, also used on H100): BLOCK_M, BLOCK_N, warps.
# Our template adds STAGES; FA2 keeps the next K/V tile in flight, which is STAGES=2 here.
FA2_FIXED = {32: (128, 128, 4), 64: (128, 128, 4), 96: (128, 64, 4), 128: (128, 64, 4), 192: (128, 64, 8),
             256: (64, 64, 4)}

# FlashAttention-3's fixed sm90 forward table (hopper/tile_size.h; ../shared/ANCHORS.md) through fa3_wgmma:
# (d, causal) -> BLOCK_M x BLOCK_N as CONSUMERS = BLOCK_M / 64 and BLOCK_N, P V's operand (SS: P_SMEM 1),
# softmax/GEMM overlap always on, pingpong for d <= 128, two stages, the persistent tile scheduler.
FA3_FIXED = {(64, 0): (3, 192, 1), (64, 1): (3, 128, 0), (96, 0): (3, 144, 1), (96, 1): (3, 144, 1),
             (128, 0): (2, 176, 0), (128, 1): (2, 128, 0), (192, 0): (2, 112, 0), (192, 1): (2, 112, 0),
             (256, 0): (2, 80, 0), (256, 1): (2, 80, 0)}


def fixed_params(family, p):
    """The fixed table's config for this point through our template, or "" when there is none."""
    if p["direction"] != "fwd":
        return ""  # the backward tables do not map onto these templates' tunables
    if family == "fa3_wgmma":
        c, bn, ss = FA3_FIXED[(p["head_dim"], int(p["causal"]))]
        pingpong = 1 if p["head_dim"] <= 128 else 0
        # FA3's persistent scheduler: PERSISTENT 1 (causal: longest first, fa3_wgmma's causal order too).
        return f"BLOCK_N={bn},CONSUMERS={c},STAGES=2,OVERLAP=1,PINGPONG={pingpong},P_SMEM={ss},PERSISTENT=1"
    bm, bn, w = FA2_FIXED[p["head_dim"]]
    return f"BLOCK_M={bm},BLOCK_N={bn},WARPS={w},STAGES=2"


def flashtune_run(ft, family, p, selector):
    shape = f"{p['batch']},{p['heads']},{p['seq_q']},{p['seq_k']},{p['head_dim']}"
    cmd = [ft, "run", "--family", family, "--shape", shape, "--dtype", p["dtype"], "--direction", p["direction"],
           "--json", *selector]
    if p["causal"]:
        cmd.append("--causal")
    if "heads_k" in p:  # grouped-query attention
        cmd += ["--heads-k", str(p["heads_k"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "error": (r.stderr or r.stdout).strip()[:200], "tflops": 0.0, "config": ""}


def write_csv(path, rows, family):
    """The rows so far, the fixed table's columns named after it (fixed_* -> fa3_table_*, tuned_vs_fixed ->
    tuned_vs_fa3_table)."""
    name = {"fa3_wgmma": "fa3_table"}.get(family, "fixed")
    renamed = [{k.replace("fixed", name): v for k, v in r.items()} for r in rows]
    with open(path + ".tmp", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(renamed[0].keys()))
        w.writeheader()
        w.writerows(renamed)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default="fa2_mma")
    ap.add_argument("--flashtune", default="build/flashtune")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    problems = sdpa_baseline.expand(json.load(open(a.problems)))
    rows = []
    for p in problems:
        families = a.family.split(",")
        runs = [dict(flashtune_run(a.flashtune, fam, p, ["--best", "--db", a.db]), family=fam) for fam in families]
        ok = [r for r in runs if r["status"] == "ok"]
        tuned = max(ok, key=lambda r: r.get("tflops", 0.0)) if ok else runs[0]
        fixed_config = fixed_params(families[0], p)
        fixed = flashtune_run(a.flashtune, families[0], p, ["--params", fixed_config]) if fixed_config \
            else {"status": "not run"}
        base = {}
        for backend in ("flash", "cudnn"):
            try:
                med, _, _ = sdpa_baseline.time_sdpa(p, backend, a.reps, 20261121)
                base[backend] = sdpa_baseline.flops(p) / (med * 1e-3) / 1e12
            except Exception as e:  # a backend refusing a shape is recorded as 0
                print(f"{backend} failed on {p}: {e}", file=sys.stderr)
                base[backend] = 0.0
        t, f = tuned.get("tflops", 0.0) if tuned["status"] == "ok" else 0.0, \
            fixed.get("tflops", 0.0) if fixed["status"] == "ok" else 0.0
        ratio = lambda x, y: f"{x / y:.3f}" if x > 0 and y > 0 else ""
        row = dict(device=tuned.get("device", ""), direction=p["direction"], head_dim=p["head_dim"], causal=int(p["causal"]), seq=p["seq_q"],
                   batch=p["batch"], heads=p["heads"], heads_k=p.get("heads_k", p["heads"]), dtype=p["dtype"],
                   tuned_family=tuned["family"],
                   tuned_config=tuned.get("config", ""),
                   tuned_status=tuned["status"], tuned_tflops=f"{t:.1f}", tuned_max_abs=tuned.get("max_abs", ""),
                   tuned_detail=json.dumps(tuned.get("detail", {})),
                   fixed_config=fixed_config, fixed_status=fixed["status"], fixed_tflops=f"{f:.1f}",
                   torch_flash_tflops=f"{base['flash']:.1f}", torch_cudnn_tflops=f"{base['cudnn']:.1f}",
                   ratio_vs_flash=ratio(t, base["flash"]), ratio_vs_cudnn=ratio(t, base["cudnn"]),
                   tuned_vs_fixed=ratio(t, f))
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items() if k not in ("device",)), file=sys.stderr, flush=True)
        write_csv(a.out, rows, families[0])  # after every point: a run stopped by a time limit keeps its rows
    print(f"{'d':>4} {'causal':>6} {'S':>6} {'H/Hk':>7} {'tuned':>7} {'fixed':>7} {'flash':>7} {'cudnn':>7} {'/flash':>7} "
          f"{'/cudnn':>7} {'/fixed':>7}")
    for r in rows:
        print(f"{r['head_dim']:>4} {r['causal']:>6} {r['seq']:>6} {str(r['heads']) + '/' + str(r['heads_k']):>7} "
              f"{r['tuned_tflops']:>7} {r['fixed_tflops']:>7} "
              f"{r['torch_flash_tflops']:>7} {r['torch_cudnn_tflops']:>7} {r['ratio_vs_flash']:>7} "
              f"{r['ratio_vs_cudnn']:>7} {r['tuned_vs_fixed']:>7}")


if __name__ == "__main__":
    main()
