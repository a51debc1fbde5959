#!/usr/bin/env python3
"""Two builds of flashtune (A: this tree, B: a candidate change to a template) timed on the same
points in one run: each point's tuned config (from `flashtune best --csv`, any device's) validated and
timed by A, B, A, B (interleaved, so that drift hits both alike); per build the median of its runs.
Writes one CSV row per point that has a config: a_tflops, b_tflops, b_over_a and both statuses.

usage: ab_builds.py --a build/flashtune --b /tmp/ab/build/flashtune --configs best.csv --db scratch.db \
                    --problems configs/problems/anchors_bwd_bf16.json --family fa2_wgmma_bwd --out ab.csv
       (--db: a scratch store; `run` stores its rows there)
"""
import argparse
import csv
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdpa_baseline  # noqa: E402
from tuned_vs_sdpa import flashtune_run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--configs", required=True, help="flashtune best --csv output: the config per point")
    ap.add_argument("--problems", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-seq", type=int, default=0,
                    help="skip longer points (each run computes its float64 reference: a backward's grows as S^2)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    point = lambda r: tuple(int(r[k]) for k in ("batch", "heads", "seq_q", "seq_k", "head_dim", "causal"))
    configs = {point(r): r["config"] for r in csv.DictReader(open(a.configs))
               if r["family"] == a.family and not r.get("varlen")}  # dense points only
    rows = []
    for p in sdpa_baseline.expand(json.load(open(a.problems))):
        config = configs.get(point(p))
        if not config or (a.max_seq and p["seq_q"] > a.max_seq):
            continue
        runs = {"a": [], "b": []}
        for _ in range(a.rounds):
            for side in ("a", "b"):
                runs[side].append(flashtune_run(getattr(a, side), a.family, p, ["--params", config, "--db", a.db]))
        tf = {s: [r.get("tflops", 0.0) for r in rs if r["status"] == "ok"] for s, rs in runs.items()}
        med = {s: statistics.median(v) if len(v) == a.rounds else 0.0 for s, v in tf.items()}
        row = dict(head_dim=p["head_dim"], causal=int(p["causal"]), seq=p["seq_q"], batch=p["batch"], heads=p["heads"],
                   config=config,
                   a_status=",".join(sorted({r["status"] for r in runs["a"]})),
                   b_status=",".join(sorted({r["status"] for r in runs["b"]})),
                   a_tflops=f"{med['a']:.1f}", b_tflops=f"{med['b']:.1f}",
                   b_over_a=f"{med['b'] / med['a']:.3f}" if med["a"] > 0 and med["b"] > 0 else "")
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
