#!/usr/bin/env python3
"""The strategies' bars on a committed sweep, replayed without a GPU (issue: the tuner at scale).

For each seed (10 by default) `flashtune tune SPACE PROBLEMS --replay DB --strategy S --seed N --json`;
per problem the median over the seeds of best_found / exhaustive_best and of the evaluations (or the
timing time) as a fraction of exhaustive's:
  guided --max-evals 25%: found >= 0.98 of the exhaustive best on every problem, evaluations <= 25%
  halving:                 found >= 0.99 on every problem, timing time <= 40% of exhaustive's
usage: replay_strategies.py FLASHTUNE SPACE PROBLEMS DB [--seeds 10] [--strategies guided,halving]
"""
import argparse
import json
import statistics
import subprocess
import sys

BARS = {  # strategy: (extra args, min found ratio, cost key, max cost fraction)
    "guided": (["--max-evals", "25%"], 0.98, "evaluations", 0.25),
    "halving": ([], 0.99, "timing_ms", 0.40),
    "random": (["--max-evals", "25%"], None, "evaluations", 0.25),  # reported for comparison, no bar
}


def replay(ft, space, problems, db, strategy, seed, extra):
    cmd = [ft, "tune", space, problems, "--replay", db, "--strategy", strategy, "--seed", str(seed), "--json",
           "--quiet"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("flashtune")
    ap.add_argument("space")
    ap.add_argument("problems")
    ap.add_argument("db")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--strategies", default="guided,halving,random")
    a = ap.parse_args()
    failed = False
    for strategy in a.strategies.split(","):
        extra, min_found, cost_key, max_cost = BARS[strategy]
        runs = [replay(a.flashtune, a.space, a.problems, a.db, strategy, seed, extra) for seed in range(1, a.seeds + 1)]
        print(f"{strategy} {' '.join(extra)} (median over {a.seeds} seeds)")
        for i, first in enumerate(runs[0]):
            p = first["problem"]
            if first["exhaustive_best_tflops"] is None:
                sys.exit(f"FAIL: {a.db} lacks candidates of problem {p}: no exhaustive best to compare with")
            found = statistics.median(r[i]["best_found_tflops"] / r[i]["exhaustive_best_tflops"] for r in runs)
            if cost_key == "evaluations":
                cost = statistics.median(r[i]["evaluations"] / r[i]["space_size"] for r in runs)
            else:
                cost = statistics.median(r[i]["timing_ms"] / r[i]["exhaustive_timing_ms"] for r in runs)
            ok = (min_found is None or found >= min_found) and cost <= max_cost
            failed |= not ok
            name = f"B{p['batch']} H{p['heads']} S{p['seq_q']} d{p['head_dim']} {p['dtype']}{' causal' if p['causal'] else ''}"
            print(f"  {name:<32} found {found:.4f} of exhaustive's best, {cost_key} {cost:.3f} of exhaustive's"
                  f"{'' if ok else '  <-- FAIL'}")
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
