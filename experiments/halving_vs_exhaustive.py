#!/usr/bin/env python3
"""The main job's picks against exhaustive tuning on the same GPU: for each problem, the config a budgeted
search picked (PICKS_DB, e.g. the main job's halving sweep) timed inside an exhaustive sweep (EXHAUSTIVE_DB,
every candidate, the same kernels), as a ratio to that sweep's best time; both figures from the one
exhaustive run, so machine drift between the two sweeps does not enter.

usage: halving_vs_exhaustive.py PICKS_DB EXHAUSTIVE_DB FAMILY OUT.csv
"""
import csv
import sqlite3
import sys


def rows(db, family):
    """problem -> {config: ms} over the fully timed rows (10 repeats or more, as `best` and `emit` pick),
    or every ok row of a problem that has none."""
    q = ("select batch, heads, seq_q, seq_k, head_dim, dtype, causal, config, ms_median, reps from results "
         "where family=? and status='ok' and ms_median > 0")
    full, cheap = {}, {}
    for b, h, sq, sk, d, dt, c, cfg, ms, reps in sqlite3.connect(db).execute(q, (family,)):
        (full if reps >= 10 else cheap).setdefault((b, h, sq, sk, d, dt, c), {})[cfg] = ms
    return {k: full.get(k) or cheap[k] for k in set(full) | set(cheap)}


def main():
    picks_db, ex_db, family, out = sys.argv[1:5]
    picks, ex = rows(picks_db, family), rows(ex_db, family)
    worst = 1.0
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "heads", "seq", "head_dim", "dtype", "causal", "picked_config", "exhaustive_best_config",
                    "picked_ms_in_exhaustive", "exhaustive_best_ms", "ratio"])
        for key in sorted(picks):
            if key not in ex:
                continue
            pick = min(picks[key], key=picks[key].get)
            best = min(ex[key], key=ex[key].get)
            if pick not in ex[key]:
                print(f"{key}: the pick {pick} has no exhaustive row", file=sys.stderr)
                continue
            ratio = ex[key][pick] / ex[key][best]
            worst = max(worst, ratio)
            b, h, sq, sk, d, dt, c = key
            w.writerow([b, h, sq, d, dt, c, pick, best, f"{ex[key][pick]:.4f}", f"{ex[key][best]:.4f}", f"{ratio:.4f}"])
            print(f"d{d} S{sq} causal={c}: pick {pick} {ratio:.4f}x the exhaustive best ({best})")
    print(f"worst: the pick takes {worst:.4f}x the exhaustive best's time")


if __name__ == "__main__":
    main()
