#!/usr/bin/env python3
"""Join flashtune's best configs (`flashtune best --csv`) with baseline rows (sdpa_baseline.py) by
problem, writing each point's TFLOP/s and the ratio to each baseline.

usage: compare.py best.csv baseline.csv [baseline.csv ...] --out comparison.csv
"""
import argparse
import csv


def key(r):
    # heads_k: grouped-query rows; files without the column are multi-head.
    heads_k = int(r.get("heads_k") or r["heads"])
    return tuple(int(r[k]) for k in ("batch", "heads", "seq_q", "seq_k", "head_dim", "causal")) + (
        r["dtype"], heads_k, r.get("direction", "fwd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("best")
    ap.add_argument("baselines", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--short", action="store_true",
                    help="torch_sdpa_<backend> columns as torch_<backend>_tflops and ratio_vs_<backend>, plus heads_k")
    a = ap.parse_args()
    best = {}
    for r in csv.DictReader(open(a.best)):
        if r.get("varlen"):  # packed variable-length rows: experiments/varlen_vs_peers.py compares those
            continue
        best[(r["family"], key(r))] = r
    base = {}
    impls = []
    for path in a.baselines:
        for r in csv.DictReader(open(path)):
            base[(r["impl"], key(r))] = r
            if r["impl"] not in impls:
                impls.append(r["impl"])
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        head = ["device", "family", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "config",
                "ms_median", "tflops"] + (["heads_k"] if a.short else [])
        for i in impls:
            short = i.replace("torch_sdpa_", "")
            head += [f"torch_{short}_tflops", f"ratio_vs_{short}"] if a.short else [f"{i}_tflops", f"ratio_vs_{i}"]
        w.writerow(head)
        for (family, k), r in sorted(best.items(), key=lambda item: (item[0][0], item[0][1][4], item[0][1][5], item[0][1][2])):
            batch, heads, seq_q, seq_k, head_dim, causal, dtype, heads_k, _ = k
            row = [r["device"], family, batch, heads, seq_q, seq_k, head_dim, dtype, causal, r["config"],
                   r["ms_median"], r["tflops"]] + ([heads_k] if a.short else [])
            for i in impls:
                b = base.get((i, k))
                bt = float(b["tflops"]) if b and b["status"] == "ok" else 0.0
                row += [f"{bt:.2f}", f"{float(r['tflops']) / bt:.3f}" if bt > 0 else ""]
            w.writerow(row)
    print(open(a.out).read())


if __name__ == "__main__":
    main()
