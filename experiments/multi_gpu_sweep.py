#!/usr/bin/env python3
"""One sweep over two (and four) GPUs against one GPU alone (issues 17, 33), read from the stores.

usage: multi_gpu_sweep.py FLASHTUNE ONE.db TWO.db TIMES.json FAULT.db OUT.csv [FOUR.db]

ONE.db: the sweep with `--devices 1`; TWO.db: the same sweep with `--devices 0,1`; FOUR.db (optional): with
`--devices 0,1,2,3` (all started from the same compile cache, so the wall times are the GPU work: run,
validate, time). TIMES.json holds {"one": {"fwd": s, "bwd": s, "runs": n}, "two": {...}} and, with FOUR.db,
"four" from the stage that ran them. FAULT.db: the fault family on `--devices 0,1`.

Checks, each printed with its figures:
- speed: two GPUs >= 1.85x one GPU's wall time, four >= 3.5x;
- same picks: per problem, the best config of every store (`flashtune best`) is the same, and their times
  within 3% of one GPU's;
- nothing lost or doubled: each multi-GPU store holds exactly the (config, problem) rows ONE.db holds, and
  the number of kernel runs its sweep reported equals its rows (a candidate run twice would show);
- every GPU worked: each multi-GPU store's rows name all its ordinals (detail.worker_device);
- a crash on one GPU: the fault store has every status, and the other GPU's worker stored rows
  after the crash.
Also printed, not judged: where the time went, per store and direction: the median per evaluation of each
phase the worker reports (detail.phase_ms), and the sums of the prepares the rows waited for
(detail.prepare_ms) and of the run requests' round trips (detail.request_ms).
Writes rows metric,value to OUT.csv (the two-GPU sweep's under their first names; the four-GPU one's with
_4gpu). Exit 1 when a bar is missed.
"""
import csv
import io
import json
import sqlite3
import subprocess
import sys

PROBLEM = "family, direction, batch, heads, seq_q, seq_k, head_dim, dtype, causal"
BAR = {"two": 1.85, "four": 3.5}
GPUS = {"two": {0, 1}, "four": {0, 1, 2, 3}}


def rows(db):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    q = f"select {PROBLEM}, config, status, ms_median, reps, detail, id from results"
    return [dict(zip(PROBLEM.split(", ") + ["config", "status", "ms", "reps", "detail", "id"], r)) for r in con.execute(q)]


def key(r):
    return tuple(r[k] for k in PROBLEM.split(", "))


def detail(r):
    return json.loads(r["detail"] or "{}")


def best(flashtune, db):
    """Per problem the pick of `flashtune best` (the fastest valid fully timed row), keyed as key()."""
    text = subprocess.run([flashtune, "best", "--db", db, "--csv"], check=True, capture_output=True, text=True).stdout
    out = {}
    for r in csv.DictReader(io.StringIO(text)):
        if r.get("varlen"):  # packed variable-length rows are not this experiment's points
            continue
        k = (r["family"], r["direction"], int(r["batch"]), int(r["heads"]), int(r["seq_q"]), int(r["seq_k"]),
             int(r["head_dim"]), r["dtype"], int(r["causal"]))
        out[k] = {"config": r["config"], "ms": float(r["ms_median"])}
    return out


def time_spent(name, rs):
    """Prints, per direction, the median per evaluation of each worker phase and the summed prepares and requests."""
    for direction in ("fwd", "bwd"):
        phases, prepare, request = {}, {}, 0.0
        for r in rs:
            if r["direction"] != direction:
                continue
            d = detail(r)
            for k, v in d.get("phase_ms", {}).items():
                phases.setdefault(k, []).append(v)
            for k, v in d.get("prepare_ms", {}).items():
                prepare[k] = prepare.get(k, 0.0) + v
            request += d.get("request_ms", 0.0)
        if phases:
            med = {k: sorted(v)[len(v) // 2] for k, v in phases.items()}
            print(f"{name} GPU(s) {direction}: median ms per evaluation " +
                  ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
        if prepare or request:
            phases = ", ".join(f"{k} {v / 1000:.1f} s" for k, v in prepare.items())
            print(f"{name} GPU(s) {direction}: stored rows' prepares {phases}; run requests {request / 1000:.1f} s")


def main():
    flashtune, one_db, two_db, times_path, fault_db, out_path = sys.argv[1:7]
    four_db = sys.argv[7] if len(sys.argv) > 7 else None
    t = json.load(open(times_path))
    stores = {"one": rows(one_db), "two": rows(two_db)}
    dbs = {"one": one_db, "two": two_db}
    if four_db:
        stores["four"], dbs["four"] = rows(four_db), four_db
    multi = [n for n in ("two", "four") if n in stores]
    suffix = {"two": "", "four": "_4gpu"}  # the two-GPU sweep's metrics keep their first names
    metrics = []
    ok = True

    wall = {n: t[n]["fwd"] + t[n]["bwd"] for n in stores}
    metrics += [("wall_s_1gpu", f"{wall['one']:.1f}")]
    for n in multi:
        metrics += [(f"wall_s_{len(GPUS[n])}gpu", f"{wall[n]:.1f}")]
    for direction in ("fwd", "bwd"):
        for n in ["one"] + multi:
            gpus = 1 if n == "one" else len(GPUS[n])
            metrics += [(f"wall_s_{gpus}gpu_{direction}", f"{t[n][direction]:.1f}")]
    for n in ["one"] + multi:
        gpus = 1 if n == "one" else len(GPUS[n])
        metrics += [(f"candidates_per_s_{gpus}gpu", f"{t[n]['runs'] / wall[n]:.2f}")]
    for n in multi:
        gpus = len(GPUS[n])
        speedup = wall["one"] / wall[n]
        metrics += [(f"speedup_{gpus}gpu_vs_1gpu", f"{speedup:.3f}")]
        per_dir = ", ".join(f"{d} {t['one'][d] / t[n][d]:.2f}" for d in ("fwd", "bwd") if t[n][d] > 0)
        print(f"wall: one GPU {wall['one']:.1f} s, {gpus} GPUs {wall[n]:.1f} s, speedup {speedup:.3f} ({per_dir}; "
              f"bar {BAR[n]}; {t['one']['runs']} and {t[n]['runs']} kernel runs)")
        ok &= speedup >= BAR[n]

    picks = {n: best(flashtune, dbs[n]) for n in stores}
    same, worst = True, 0.0
    for k in sorted(set().union(*picks.values()), key=str):
        r1 = picks["one"].get(k)
        line = f"  {k[0]} {k[2:]}: one {r1['config']} {r1['ms']:.4f} ms" if r1 else f"  {k[0]} {k[2:]}: one -"
        mark = "" if r1 else "  <-- differs"
        for n in multi:
            r = picks[n].get(k)
            if r1 is None or r is None:
                line += f" | {n} {'-' if r is None else r['config']}"
                mark = "  <-- differs"
                continue
            dev = abs(r["ms"] / r1["ms"] - 1)
            worst = max(worst, dev)
            line += f" | {n} {r['config']} {r['ms']:.4f} ms ({dev * 100:.1f}%)"
            if r["config"] != r1["config"] or dev > 0.03:
                mark = "  <-- differs"
        same &= not mark
        print(line + mark)
    metrics += [("problems", str(len(picks["one"]))), ("same_best_configs", "yes" if same else "no"),
                ("best_time_max_deviation_pct", f"{worst * 100:.2f}")]
    ok &= same

    k1 = {key(r) + (r["config"],) for r in stores["one"]}
    metrics += [("rows_1gpu", str(len(stores["one"])))]
    for n in multi:
        gpus = len(GPUS[n])
        kn = [key(r) + (r["config"],) for r in stores[n]]
        lost = len(k1 - set(kn)) + len(set(kn) - k1)
        doubled = (len(kn) - len(set(kn))) + max(0, t[n]["runs"] - len(kn))
        metrics += [(f"rows_{gpus}gpu", str(len(kn))), (f"kernel_runs_{gpus}gpu", str(t[n]["runs"])),
                    ("rows_lost_or_duplicated" + suffix[n], str(lost + doubled))]
        print(f"rows: one {len(stores['one'])}, {n} {len(kn)} from {t[n]['runs']} runs; lost {lost}, doubled {doubled}")
        ok &= lost + doubled == 0

        per_dev = {}
        for r in stores[n]:
            d = detail(r).get("worker_device")
            per_dev[d] = per_dev.get(d, 0) + 1
        print(f"rows per GPU ordinal in the {gpus}-GPU sweep: {per_dev}")
        for d, c in sorted(per_dev.items(), key=str):
            metrics.append((f"rows{suffix[n]}_gpu{d}", str(c)))
        ok &= set(per_dev) == GPUS[n]

    # Where an evaluation's time went: a CPU-bound phase that grows with the workers is what holds the speedup back.
    for n in ["one"] + multi:
        time_spent(n, stores[n])

    fault = rows(fault_db)
    want = {"MODE=1": "crashed", "MODE=2": "timeout", "MODE=0": "ok"}
    bad = [r for r in fault if want[r["config"]] != r["status"]]
    crashes = [r for r in fault if r["status"] in ("crashed", "timeout")]
    dev_of = lambda r: detail(r).get("worker_device")
    after = [r for r in fault if crashes and r["status"] == "ok" and r["id"] > crashes[0]["id"]
             and dev_of(r) != dev_of(crashes[0])]
    fault_ok = not bad and len(crashes) > 0 and len(after) > 0
    print(f"fault sweep on two GPUs: {len(fault)} rows, {len(crashes)} crashed or hung "
          f"(first on GPU {dev_of(crashes[0]) if crashes else None}), {len(after)} ok rows from the other GPU "
          f"after it, wrong statuses {len(bad)}")
    metrics += [("fault_rows", str(len(fault))), ("fault_sweep_complete", "yes" if fault_ok else "no")]
    ok &= fault_ok

    with open(out_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "value"])
        w.writerows(metrics)
    print("bar met" if ok else "bar NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
