#!/usr/bin/env python3
"""The main job's picks against the exhaustive best, interleaved in one run: for every point of a
halving_vs_exhaustive CSV where the two configs differ, `flashtune run` times the pick and the exhaustive
best alternately (A B A B ..., ROUNDS each, every run validated first), and the ratio is the pick's median
over the best's. Two figures from two sweeps minutes apart carry the GPU's drift between them (power
capping at S 16k moves a kernel's time by several percent); alternating runs of the two share it.

usage: ab_picks.py FLASHTUNE HALVING_VS_EXHAUSTIVE.csv FAMILY OUT.csv [--rounds 3] [--min-ratio R]
(--min-ratio: only the points whose sweep ratio is above R). A config that fails in `run` (it can: ptxas's
register allocation of one source varies between compiles, and a variant that compiled spill-free in the
sweep may spill, and be pruned, in another process) is reported in the row and the rest go on.
"""
import argparse
import csv
import json
import statistics
import subprocess
import sys


def run(ft, family, row, config):
    direction = "bwd" if family.endswith("_bwd") else "fwd"
    seq = row["seq"]
    cmd = [ft, "run", "--family", family, "--params", config, "--shape",
           f"{row['batch']},{row['heads']},{seq},{seq},{row['head_dim']}", "--dtype", row["dtype"],
           "--direction", direction, "--json"]
    if row["causal"] in ("1", "True", "true"):
        cmd.append("--causal")
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        j = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"no JSON from flashtune run: {r.stderr.strip()[:200]}")
    if j.get("status") != "ok":
        raise RuntimeError(f"{j.get('status')}: {j.get('error', '')[:200]}")
    return float(j["ms_median"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("flashtune")
    ap.add_argument("csv")
    ap.add_argument("family")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-ratio", type=float, default=1.0)
    a = ap.parse_args()
    rows = [r for r in csv.DictReader(open(a.csv))
            if r["picked_config"] != r["exhaustive_best_config"] and float(r["ratio"]) > a.min_ratio]
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "heads", "seq", "head_dim", "dtype", "causal", "picked_config", "exhaustive_best_config",
                    "sweep_ratio", "picked_ms", "best_ms", "ab_ratio", "error"])
        worst = 1.0
        for r in rows:
            pick, best = [], []
            try:
                for _ in range(a.rounds):
                    pick.append(run(a.flashtune, a.family, r, r["picked_config"]))
                    best.append(run(a.flashtune, a.family, r, r["exhaustive_best_config"]))
            except RuntimeError as e:
                which = "exhaustive best" if len(pick) > len(best) else "pick"
                w.writerow([r["batch"], r["heads"], r["seq"], r["head_dim"], r["dtype"], r["causal"], r["picked_config"],
                            r["exhaustive_best_config"], r["ratio"], "", "", "", f"{which}: {e}"])
                print(f"d{r['head_dim']} S{r['seq']} causal={r['causal']}: the {which} failed: {e}")
                continue
            ratio = statistics.median(pick) / statistics.median(best)
            worst = max(worst, ratio)
            w.writerow([r["batch"], r["heads"], r["seq"], r["head_dim"], r["dtype"], r["causal"], r["picked_config"],
                        r["exhaustive_best_config"], r["ratio"], f"{statistics.median(pick):.4f}",
                        f"{statistics.median(best):.4f}", f"{ratio:.4f}", ""])
            print(f"d{r['head_dim']} S{r['seq']} causal={r['causal']}: sweeps {float(r['ratio']):.4f}x, "
                  f"interleaved {ratio:.4f}x (pick {pick}, best {best})")
        print(f"worst interleaved: {worst:.4f}x")


if __name__ == "__main__":
    main()
