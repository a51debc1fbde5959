#!/usr/bin/env python3
"""Issue 36's first-use measurement: tuning at first use on a GPU standing for an untabled one, against the
committed table's picks, GPU kernel time: reports/<gpu>/autotune_first_use.csv.

What "the 18 grid points" are here: the 18-point standard bf16 grid (16384 tokens, hidden 2048: S 1k, 4k, 16k x
d 64, 128, 256 x causal or not), each one first-use bucket. Tuning at first use tunes a bucket's forward AND its
backward within one budget, so both are measured: a forward row (configs/problems/anchors_bf16.json) and a
backward row (anchors_bwd_bf16.json, the same 18 points) per bucket, 36 rows by default, the bar on every row;
tune_s, the bucket's one tune, is on both. (--problems anchors_bf16.json alone: the forward rows.)

Two processes, as a user's two runs (each a child of this script):
  1. first use (`FLASHTUNE_TABLES=off`: the committed tables ignored, as on a GPU with none; FLASHTUNE_AUTOTUNE=1,
     FLASHTUNE_AUTOTUNE_BUDGET=--budget-s; the user's store in --store-dir, a fresh temporary folder by default,
     never the user's own cache): per bucket, the first attention() call, forward and backward, tunes the bucket
     into the store. tune_s is the wall time of that tune (flashtune.tune, as the op calls it), first_call_s the
     whole first call (the tune, then the new picks compiled and run). explain() must name the user's store for
     the forward and the backward afterwards.
  2. a second process, tables off and first use on again: explain() must name the user's store before the first
     call (the stored picks), and the first call must not tune (flashtune.tune is replaced by a stub that records
     the call and fails it; the store's row count must not move; second_first_call_s shows the time). Then the
     autotuned picks are timed, and the committed table's picks (FLASHTUNE_TABLES=on, the user's store out of the
     way: XDG_CACHE_HOME an empty folder, settings reloaded) timed on the same inputs, forward and backward.
ratio = autotuned_tflops / table_tflops. Bar (issue 36): ratio >= 0.97 at every bucket with tune_s <= 60.

Timer (experiments/kernel_timer.py, as fwd_peers.py and bwd_peers.py): the summed durations of the kernels one
call launches, read from torch.profiler, L2 flushed and synchronised before each call outside the profiled window,
warm-up calls first, the median of --reps. Inputs seeded N(0, 1), [B, H, S, d]. FLOPs: 4 B H Sq Sk d (halved
causal), x2.5 for the backward.

Faults: "a faulting candidate during autotune leaves the caller running". faulted_candidates counts the store's
rows a bucket's tune recorded as crashed or timed out (the caller went on). --fault-check forces one: before the
grid, a small bucket (bf16 d 64, S 256) is tuned at first use through a wrapper of the CLI whose first `tune` first
sweeps the test-only `fault` family (MODE 1 writes out of bounds, into a scratch store); the caller must go on, the
scratch store hold a crashed row and the small bucket come out tuned: <out>_fault_check.json.

A row per (bucket, direction) is written as it is measured: a run cut by its time limit keeps its rows.
--subset N and --offset M measure buckets M..M+N-1 only (a call of at most 10 minutes fits ~4 buckets at 60 s).

usage: autotune_first_use.py --out reports/<gpu>/autotune_first_use.csv [--budget-s 60] [--subset N] [--offset M]
       [--problems A.json ...] [--store-dir DIR] [--reps 10] [--time-limit-s S] [--fault-check]
       (PYTHONPATH=python, FLASHTUNE_LIBRARY, FLASHTUNE_CLI=build/flashtune from a build tree)
"""
import argparse
import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import baselines  # noqa: E402  (no torch at import)

ISSUE_COLUMNS = ("bucket", "budget_s", "tune_s", "autotuned_tflops", "table_tflops", "ratio")
COLUMNS = ["bucket", "direction", "budget_s", "tune_s", "autotuned_tflops", "table_tflops", "ratio",
           "autotuned_pick", "table_pick", "table_source", "first_call_s", "second_source", "second_first_call_s",
           "second_tuned", "faulted_candidates", "note"]
DEFAULT_PROBLEMS = ("configs/problems/anchors_bf16.json", "configs/problems/anchors_bwd_bf16.json")
MAX_BUDGET_S = 600.0
BAR_RATIO, BAR_TUNE_S = 0.97, 60.0
# Predicted wall time of one bucket (the --time-limit-s pacing and the docs): its tune plus the first call's
# compiles, and its timing in the second process (four timed calls and their compiles).
EXTRA_TUNE_S, TIME_S = 15.0, 30.0
FAULT_SHAPE = {"batch": 1, "heads": 2, "seq_q": 256, "seq_k": 256, "head_dim": 64, "dtype": "bf16", "causal": True}
FAULT_BUDGET_S = 10.0


class ArgumentError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own: the usage first)
        print(f"autotune_first_use: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the CSV (a row per bucket and direction as measured)")
    ap.add_argument("--problems", nargs="+", default=[os.path.join(SRC, p) for p in DEFAULT_PROBLEMS])
    ap.add_argument("--budget-s", type=float, default=60.0, help="tuning budget per bucket, seconds (default 60)")
    ap.add_argument("--store-dir", help="the XDG_CACHE_HOME of both processes (the user's store under it); "
                                        "default: a fresh temporary folder, removed at the end")
    ap.add_argument("--subset", type=int, help="measure N buckets only")
    ap.add_argument("--offset", type=int, default=0, help="skip the first M buckets")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=20261136)
    ap.add_argument("--time-limit-s", type=float, default=0.0,
                    help="start no bucket whose predicted tune and timing would end past this (0: no limit)")
    ap.add_argument("--fault-check", action="store_true", help="first, a tune with a faulting candidate")
    ap.add_argument("--phase", choices=("tune", "time"), help=argparse.SUPPRESS)  # the children
    ap.add_argument("--state", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        check_args(a)
    except ArgumentError as e:
        ap.error(str(e))
    return a


def check_args(a):
    """The arguments' values, and the buckets they name into a.buckets; ArgumentError, one line."""
    if a.phase:
        return
    if not 1.0 <= a.budget_s <= MAX_BUDGET_S:
        raise ArgumentError(f"--budget-s must be in 1..{MAX_BUDGET_S:g}, got {a.budget_s:g}")
    if a.subset is not None and a.subset < 1:
        raise ArgumentError(f"--subset must be at least 1, got {a.subset}")
    if a.offset < 0:
        raise ArgumentError(f"--offset must be at least 0, got {a.offset}")
    if not 1 <= a.reps <= 1000:
        raise ArgumentError(f"--reps must be in 1..1000, got {a.reps}")
    if a.time_limit_s < 0:
        raise ArgumentError(f"--time-limit-s must be at least 0, got {a.time_limit_s:g}")
    folder = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(folder):
        raise ArgumentError(f"--out: no folder {folder}")
    if a.store_dir is not None and os.path.exists(a.store_dir) and not os.path.isdir(a.store_dir):
        raise ArgumentError(f"--store-dir: {a.store_dir} is not a folder")
    buckets = load_buckets(a.problems)
    a.buckets = buckets[a.offset:a.offset + a.subset if a.subset else None]
    if not a.buckets:
        raise ArgumentError(f"--offset {a.offset}: past the {len(buckets)} buckets of --problems")


def bucket_name(shape):
    """"bf16 d128 causal S4096 B4 H16": the bucket's dtype, head dim, mask, sequence and the grid's B and H."""
    mask = "causal" if shape["causal"] else "full"
    seq = shape["seq_q"] if shape["seq_q"] == shape["seq_k"] else f"{shape['seq_q']}x{shape['seq_k']}"
    heads = shape["heads"] if "heads_k" not in shape else f"{shape['heads']}/{shape['heads_k']}"
    return f"{shape['dtype']} d{shape['head_dim']} {mask} S{seq} B{shape['batch']} H{heads}"


def load_buckets(files):
    """[{"name", "shape", "directions"}] in the order of first appearance: one per shape, its directions the ones
    the files hold (a forward and a backward point of one shape are one first-use bucket)."""
    out = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                problems = baselines.load_problems(json.load(fh))
        except (OSError, ValueError) as e:
            raise ArgumentError(f"--problems {path}: {e}") from None
        for p in problems:
            if p.get("inputs"):
                raise ArgumentError(f"--problems {path}: the inputs are the op's N(0, 1): no 'inputs' field")
            shape = {k: p[k] for k in ("batch", "heads", "heads_k", "seq_q", "seq_k", "head_dim", "dtype", "causal")
                     if k in p}
            key = json.dumps(shape, sort_keys=True)
            b = out.setdefault(key, {"name": bucket_name(shape), "shape": shape, "directions": []})
            if p["direction"] not in b["directions"]:
                b["directions"].append(p["direction"])
    if not out:
        raise ArgumentError("--problems: no problems")
    for b in out.values():
        b["directions"].sort(key=("fwd", "bwd").index)
    return list(out.values())


def tflops(shape, direction, ms):
    return baselines.flops(dict(shape, direction=direction)) / (ms * 1e-3) / 1e12


def ratio_text(autotuned, table):
    return f"{autotuned / table:.3f}" if autotuned and table else ""


def make_row(bucket, direction, budget_s, tuned, timed):
    """A CSV row from the first process's record of a bucket and the second's timing of one direction."""
    t = timed.get(direction, {})
    auto_tf, table_tf = t.get("autotuned_tflops"), t.get("table_tflops")
    notes = [n for n in (tuned.get("note", ""), timed.get("note", "")) if n]
    return {
        "bucket": bucket["name"], "direction": direction, "budget_s": f"{budget_s:g}",
        "tune_s": f"{tuned['tune_s']:.1f}" if tuned.get("tune_s") is not None else "",
        "autotuned_tflops": f"{auto_tf:.1f}" if auto_tf else "", "table_tflops": f"{table_tf:.1f}" if table_tf else "",
        "ratio": ratio_text(auto_tf, table_tf), "autotuned_pick": t.get("autotuned_pick", ""),
        "table_pick": t.get("table_pick", ""), "table_source": t.get("table_source", ""),
        "first_call_s": f"{tuned['first_call_s']:.1f}" if tuned.get("first_call_s") is not None else "",
        "second_source": timed.get("second_source", ""),
        "second_first_call_s": (f"{timed['second_first_call_s']:.1f}"
                                if timed.get("second_first_call_s") is not None else ""),
        "second_tuned": timed.get("second_tuned", ""), "faulted_candidates": str(tuned.get("faulted", "")),
        "note": "; ".join(notes)[:300],
    }


def meets_bar(row):
    """Issue 36's bar for one row: ratio >= 0.97 with tune_s <= 60."""
    try:
        return float(row["ratio"]) >= BAR_RATIO and float(row["tune_s"]) <= BAR_TUNE_S
    except (KeyError, ValueError):
        return False


def child_env(store_dir, budget_s):
    """The children's environment: tables off, first use on with the budget, the user's store under store_dir."""
    env = dict(os.environ, XDG_CACHE_HOME=store_dir, FLASHTUNE_TABLES="off", FLASHTUNE_AUTOTUNE="1",
               FLASHTUNE_AUTOTUNE_BUDGET=f"{budget_s:g}", PYTHONUNBUFFERED="1")
    env.pop("FLASHTUNE_DB", None)  # an explicit store would come before the user's
    env.setdefault("FLASHTUNE_CACHE_DIR", os.path.join(store_dir, "kernel-cache"))  # one kernel cache for both
    python = os.path.join(SRC, "python")
    if os.path.isdir(os.path.join(python, "flashtune")) and python not in env.get("PYTHONPATH", "").split(":"):
        env["PYTHONPATH"] = python + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def fault_cli(work, real_cli):
    """A CLI wrapper whose first `tune` first sweeps the test-only fault family (MODE 1 writes out of bounds, MODE 0
    is correct) into a scratch store, then runs the real tune: a faulting candidate inside an autotune."""
    space = os.path.join(work, "fault_space.json")
    problems = os.path.join(work, "fault_problems.json")
    with open(space, "w") as fh:
        json.dump({"description": "autotune_first_use --fault-check", "family": "fault", "params": {"MODE": [1, 0]},
                   "head_dims": [32], "causal": [False], "dtypes": ["fp32"]}, fh)
    with open(problems, "w") as fh:
        json.dump({"problems": [{"batch": 1, "heads": 2, "seq_q": 100, "seq_k": 130, "head_dim": 32}]}, fh)
    os.makedirs(os.path.join(work, "bin"), exist_ok=True)
    path = os.path.join(work, "bin", "flashtune")
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"  # noqa: E731
    mark, db, log = (os.path.join(work, n) for n in ("fault.done", "fault.db", "fault.log"))
    with open(path, "w") as fh:
        fh.write(f"""#!/bin/sh
if [ "$1" = tune ] && [ ! -e {q(mark)} ]; then
  : > {q(mark)}
  {q(real_cli)} tune {q(space)} {q(problems)} --db {q(db)} --timeout 5 --quiet > {q(log)} 2>&1
fi
exec {q(real_cli)} "$@"
""")
    os.chmod(path, 0o700)
    return path, db


# ---------------------------------------------------------------------------------------- the children
def store_counts(path):
    """(rows, crashed or timed-out rows) of a results store; (0, 0) when it does not exist yet."""
    if not os.path.exists(path):
        return 0, 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        rows = c.execute("select count(*), sum(status in ('crashed', 'timeout')) from results").fetchone()
    return rows[0] or 0, rows[1] or 0


def pick_text(e):
    return f"{e.get('family', '')} {e.get('config', e.get('error', ''))}".strip()


def sources(e):
    return f"{e.get('source', '')}/{e.get('backward', {}).get('source', '')}"


def inputs(torch, shape, seed):
    B, H, Sq, Sk, d = shape["batch"], shape["heads"], shape["seq_q"], shape["seq_k"], shape["head_dim"]
    Hk = shape.get("heads_k", H)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[shape["dtype"]]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, Sq, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    k = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    v = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    dout = torch.randn(B, H, Sq, d, device="cuda", dtype=dt, generator=g)
    return q, k, v, dout


def first_call(torch, ftt, q, k, v, dout, causal):
    """The bucket's first call, forward and backward, as a training step makes it; its wall time."""
    t0 = time.monotonic()
    ftt.attention(q, k, v, causal=causal).backward(dout)
    torch.cuda.synchronize()
    return time.monotonic() - t0


def tune_phase(state):
    """The first process: each bucket's first call tunes it (tables off); a JSON line per bucket."""
    import torch
    import flashtune._tune as tune_module
    import flashtune.torch as ftt

    tunes = []
    real_tune = tune_module.tune

    def timed_tune(*args, **kwargs):  # what the op's first use calls (torch.py imports it at each first use)
        t0 = time.monotonic()
        try:
            return real_tune(*args, **kwargs)
        finally:
            tunes.append(time.monotonic() - t0)

    tune_module.tune = timed_tune
    out = open(state["tuned"], "a")

    def run(bucket):
        shape = bucket["shape"]
        q, k, v, dout = inputs(torch, shape, state["seed"])
        store = ftt._user_store(q.device.index or 0)
        before = sources(ftt.explain(q, k, v, causal=shape["causal"]))
        rows0, faulted0 = store_counts(store)
        del tunes[:]
        rec = {"bucket": bucket["name"], "before": before}
        try:
            rec["first_call_s"] = first_call(torch, ftt, q, k, v, dout, shape["causal"])
        except Exception as e:  # noqa: BLE001 - the call failing is a result
            rec["note"] = baselines.one_line(f"first call: {type(e).__name__}: {e}")
        rec["tune_s"] = tunes[0] if tunes else None
        rec["after"] = sources(ftt.explain(q, k, v, causal=shape["causal"]))
        rows1, faulted1 = store_counts(store)
        rec["rows"], rec["faulted"] = rows1 - rows0, faulted1 - faulted0
        if rec["after"] != "user/user":
            rec["note"] = (rec.get("note", "") + f" not tuned at first use ({before} -> {rec['after']})").strip()
        elif not tunes:
            rec["note"] = (rec.get("note", "") + f" tuned before this process ({before})").strip()
        del q, k, v, dout
        torch.cuda.empty_cache()
        return rec

    if state.get("fault_cli"):  # --fault-check: a small bucket tuned through the faulting CLI first
        os.environ["FLASHTUNE_CLI"] = state["fault_cli"]
        bucket = {"name": bucket_name(FAULT_SHAPE), "shape": FAULT_SHAPE}
        budget = os.environ["FLASHTUNE_AUTOTUNE_BUDGET"]
        ftt.autotune(budget=FAULT_BUDGET_S)
        rec = run(bucket)
        ftt.autotune(budget=float(budget))
        os.environ["FLASHTUNE_CLI"] = state["real_cli"]
        rows, crashed = store_counts(state["fault_db"])
        rec.update(fault_rows=rows, fault_crashed=crashed, caller_running=True)
        rec["passed"] = crashed >= 1 and rec["after"] == "user/user"
        with open(state["fault_out"], "w") as fh:
            json.dump(rec, fh, indent=1)
        print(f"fault check: {'passed' if rec['passed'] else 'FAILED'}: {crashed} of {rows} fault candidates crashed, "
              f"the caller went on, the small bucket {rec['before']} -> {rec['after']}", file=sys.stderr)

    for bucket in state["buckets"]:
        if state["deadline"] and time.time() + state["predicted_s"] > state["deadline"]:
            print(f"tune: {bucket['name']} not started: the time limit", file=sys.stderr)
            break
        rec = run(bucket)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(f"tuned {bucket['name']}: tune {rec['tune_s']} s, first call {rec.get('first_call_s')} s, "
              f"{rec['before']} -> {rec['after']}, faulted {rec['faulted']} {rec.get('note', '')}", file=sys.stderr)
    out.close()


def time_phase(state):
    """The second process: the stored picks found with no tuning, then timed beside the committed table's picks;
    rows appended to the CSV as measured."""
    import torch
    import flashtune._tune as tune_module
    import flashtune.torch as ftt
    from flashtune import FlashtuneError, _lib
    from kernel_timer import kernel_ms, l2_flush

    tunes = []

    def no_tune(*args, **kwargs):  # a second process must not tune: recorded, and failed rather than run
        tunes.append(args)
        raise FlashtuneError("autotune_first_use: the second process started a tune")

    tune_module.tune = no_tune
    flush = l2_flush()
    tuned = {}
    if os.path.exists(state["tuned"]):  # absent: the first process tuned nothing
        with open(state["tuned"]) as fh:
            for line in fh:
                rec = json.loads(line)
                tuned[rec["bucket"]] = rec
    out = open(state["out"], "a", newline="")
    w = csv.DictWriter(out, fieldnames=COLUMNS)

    def use_tables(on):
        os.environ["FLASHTUNE_TABLES"] = "on" if on else "off"
        os.environ["XDG_CACHE_HOME"] = state["no_store_dir"] if on else state["store_dir"]
        _lib.reload_settings()

    def timed(shape, q, k, v, dout):
        """(forward ms, backward ms) of what the runtime picks now."""
        causal = shape["causal"]
        with torch.no_grad():
            fwd, _ = kernel_ms(lambda: ftt.attention(q, k, v, causal=causal), flush, state["reps"])
        o = ftt.attention(q, k, v, causal=causal)
        bwd, _ = kernel_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), flush, state["reps"])
        return {"fwd": fwd, "bwd": bwd}

    for bucket in state["buckets"]:
        rec = tuned.get(bucket["name"])
        if rec is None:
            continue  # not reached by the first process
        shape = bucket["shape"]
        timing = {}
        try:
            q, k, v, dout = inputs(torch, shape, state["seed"])
            store = ftt._user_store(q.device.index or 0)
            e = ftt.explain(q, k, v, causal=shape["causal"])
            timing["second_source"] = sources(e)
            rows0, _ = store_counts(store)
            del tunes[:]
            timing["second_first_call_s"] = first_call(torch, ftt, q, k, v, dout, shape["causal"])
            moved = store_counts(store)[0] != rows0
            timing["second_tuned"] = "yes" if tunes or moved else "no"
            auto_ms = timed(shape, q, k, v, dout)
            use_tables(True)
            t = ftt.explain(q, k, v, causal=shape["causal"])
            table_ms = timed(shape, q, k, v, dout)
            use_tables(False)
            for dr in bucket["directions"]:
                auto_e, table_e = (x if dr == "fwd" else x.get("backward", {}) for x in (e, t))
                timing[dr] = {"autotuned_tflops": tflops(shape, dr, auto_ms[dr]),
                              "table_tflops": tflops(shape, dr, table_ms[dr]), "autotuned_pick": pick_text(auto_e),
                              "table_pick": pick_text(table_e), "table_source": table_e.get("source", "")}
            if timing["second_source"] != "user/user" or timing["second_tuned"] != "no":
                timing["note"] = "the second process did not use the stored picks alone"
            del q, k, v, dout
        except Exception as ex:  # noqa: BLE001 - a bucket that fails is a row with its reason
            timing["note"] = baselines.one_line(f"timing: {type(ex).__name__}: {ex}")
            if os.environ.get("FLASHTUNE_TABLES") == "on":
                use_tables(False)
        torch.cuda.empty_cache()
        for dr in bucket["directions"]:
            row = make_row(bucket, dr, state["budget_s"], rec, timing)
            w.writerow(row)
            out.flush()
            print(f"{row['bucket']} {dr}: autotuned {row['autotuned_tflops']} ({row['autotuned_pick']}) table "
                  f"{row['table_tflops']} ({row['table_pick']}) ratio {row['ratio']} tune {row['tune_s']} s "
                  f"{'meets the bar' if meets_bar(row) else 'BELOW THE BAR'} {row['note']}", file=sys.stderr)
    out.close()


# ---------------------------------------------------------------------------------------- the parent
def main(argv=None):
    a = parse_args(argv)
    if a.phase:
        with open(a.state) as fh:
            state = json.load(fh)
        (tune_phase if a.phase == "tune" else time_phase)(state)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit: the temporary folders still go
    start = time.time()
    temporary = a.store_dir is None
    store_dir = tempfile.mkdtemp(prefix="ft-autotune36-") if temporary else os.path.abspath(a.store_dir)
    os.makedirs(store_dir, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ft-autotune36-work-")
    no_store_dir = os.path.join(work, "no-store")
    os.makedirs(no_store_dir, mode=0o700)
    env = child_env(store_dir, a.budget_s)
    state = {"buckets": a.buckets, "budget_s": a.budget_s, "seed": a.seed, "reps": a.reps, "store_dir": store_dir,
             "no_store_dir": no_store_dir, "tuned": os.path.join(work, "tuned.jsonl"), "out": os.path.abspath(a.out),
             "predicted_s": a.budget_s + EXTRA_TUNE_S + TIME_S, "deadline": 0.0}
    if a.time_limit_s:  # the first process stops early enough for the second to time what it tuned
        state["deadline"] = start + a.time_limit_s - TIME_S * len(a.buckets)
        state["predicted_s"] = a.budget_s + EXTRA_TUNE_S
    if a.fault_check:
        sys.path.append(os.path.join(SRC, "python"))  # an installed flashtune first
        from flashtune._cli import cli_path
        state["real_cli"] = cli_path()
        state["fault_cli"], state["fault_db"] = fault_cli(work, state["real_cli"])
        state["fault_out"] = os.path.splitext(os.path.abspath(a.out))[0] + "_fault_check.json"
    with open(os.path.join(work, "state.json"), "w") as fh:
        json.dump(state, fh)
    with open(a.out, "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=COLUMNS).writeheader()
    print(f"autotune_first_use: {len(a.buckets)} buckets, budget {a.budget_s:g} s each, store under {store_dir}; "
          f"predicted {len(a.buckets) * (a.budget_s + EXTRA_TUNE_S + TIME_S):.0f} s", file=sys.stderr)
    me = [sys.executable, os.path.abspath(__file__), "--out", a.out, "--state", os.path.join(work, "state.json")]
    rc = 0
    try:
        for phase in ("tune", "time"):
            r = subprocess.run(me + ["--phase", phase], env=env, stdin=subprocess.DEVNULL)
            print(f"autotune_first_use: {phase} process exit {r.returncode}, {time.time() - start:.0f} s",
                  file=sys.stderr)
            rc = rc or r.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if temporary:
            shutil.rmtree(store_dir, ignore_errors=True)
    with open(a.out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    met = sum(meets_bar(r) for r in rows)
    print(f"autotune_first_use: {met} of {len(rows)} rows meet the bar (ratio >= {BAR_RATIO}, tune_s <= "
          f"{BAR_TUNE_S:g}); {a.out}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
