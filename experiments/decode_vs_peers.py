#!/usr/bin/env python3
"""Decoding on one GPU in one run: per point of a problem set, the tuned decode family (the stored best
config re-timed by `flashtune run --best`: the worker's CUDA events, warm-up, L2 flush, median), torch
SDPA with each backend forced (enable_gqa for grouped-query points; a backend that refuses the shape or
runs out of memory is recorded, not fatal), and a device-to-device copy moving the same bytes (half of
them read, half written: the copy peak), the torch ones timed as experiments/sdpa_baseline.py times
(warm-up, an L2 flush before each repeat, CUDA events, median). GB/s count the compulsory bytes
(Problem::bytes: Q, K, V, O, LSE once), so pct_of_copy_peak is the copy's time over the kernel's.

usage: decode_vs_peers.py --db reports/<gpu>/results.db --problems configs/problems/decode_bf16.json \\
                          --out reports/<gpu>/decode_vs_peers.csv [--family decode_splitkv] [--flashtune build/flashtune]
Rows are written as each point finishes, so a run stopped by a time limit keeps what it measured.
"""
import argparse
import csv
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402
import sdpa_baseline  # noqa: E402
from tuned_vs_sdpa import flashtune_run  # noqa: E402

BACKENDS = ("flash", "efficient", "cudnn", "math")
COLUMNS = ["batch", "heads_q", "heads_k", "seq_q", "seq_k", "tuned_config", "tuned_gbps", "pct_of_copy_peak",
           "best_torch_backend", "ratio_vs_best_torch",
           # what the figures above come from
           "device", "head_dim", "dtype", "causal", "tuned_status", "tuned_ms", "copy_gbps"] + \
          [f"torch_{b}_gbps" for b in BACKENDS] + ["torch_notes"]


def gbps(p, ms):
    return baselines.bytes_moved(p) / (ms * 1e-3) / 1e9 if ms > 0 else 0.0


def release():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the next measurement (another process, or a larger tensor) gets the memory


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default="decode_splitkv")
    ap.add_argument("--flashtune", default="build/flashtune")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    a = ap.parse_args()
    problems = sdpa_baseline.expand(json.load(open(a.problems)))
    device = torch.cuda.get_device_name(0)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for p in problems:
            tuned = flashtune_run(a.flashtune, a.family, p, ["--best", "--db", a.db])  # before torch holds memory
            ok = tuned["status"] == "ok"
            tuned_gbps = tuned.get("gbps", 0.0) if ok else 0.0
            torch_gbps, notes = {}, []
            for b in BACKENDS:
                try:
                    med, _, _ = sdpa_baseline.time_sdpa(p, b, a.reps, a.seed)
                    torch_gbps[b] = gbps(p, med)
                except Exception as e:  # refused shape, out of memory: a result, not a crash
                    torch_gbps[b] = 0.0
                    notes.append(f"{b}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
                release()
            try:
                copy_ms, _, _ = sdpa_baseline.time_copy(int(baselines.bytes_moved(p)) // 2, a.reps)
                copy_gbps = gbps(p, copy_ms)
            except Exception as e:
                copy_gbps = 0.0
                notes.append(f"copy: {type(e).__name__}")
            release()
            best = max(BACKENDS, key=lambda b: torch_gbps[b])
            best_gbps = torch_gbps[best]
            row = dict(batch=p["batch"], heads_q=p["heads"], heads_k=p.get("heads_k", p["heads"]), seq_q=p["seq_q"],
                       seq_k=p["seq_k"], tuned_config=tuned.get("config", ""), tuned_gbps=f"{tuned_gbps:.1f}",
                       pct_of_copy_peak=f"{100 * tuned_gbps / copy_gbps:.1f}" if tuned_gbps > 0 and copy_gbps > 0 else "",
                       best_torch_backend=best if best_gbps > 0 else "",
                       ratio_vs_best_torch=f"{tuned_gbps / best_gbps:.3f}" if tuned_gbps > 0 and best_gbps > 0 else "",
                       device=device, head_dim=p["head_dim"], dtype=p["dtype"], causal=int(p["causal"]),
                       tuned_status=tuned["status"] + ("" if ok else ": " + str(tuned.get("error", ""))[:120]),
                       tuned_ms=f"{tuned.get('ms_median', 0.0):.4f}" if ok else "", copy_gbps=f"{copy_gbps:.1f}",
                       torch_notes="; ".join(notes))
            row.update({f"torch_{b}_gbps": f"{torch_gbps[b]:.1f}" for b in BACKENDS})
            w.writerow(row)
            fh.flush()
            print(" ".join(f"{k}={row[k]}" for k in COLUMNS[:10]), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
