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

--paged: the points of a paged problem set (configs/problems/decode_paged_bf16.json, as `flashtune problems --json`
reads it), each timed three ways in one run, all by `flashtune run` (the worker's events, warm-up, L2 flush, median):
the paged cache's own stored pick (--best with --paged), the same shape's dense pick on contiguous K/V (--best; the
decode_bf16.json rows of the same store), and that dense pick's config on the paged cache (--params, where its
BLOCK_N divides the page; the same number as the paged pick's when the configs agree): the cost of reading through
the block table apart from the choice of config. No torch needed: torch SDPA has no paged cache.
usage: decode_vs_peers.py --paged --db reports/<gpu>/results.db --problems configs/problems/decode_paged_bf16.json \\
                          --out reports/<gpu>/decode_paged_vs_dense.csv
"""
import argparse
import csv
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402  (torch is imported where the dense comparison needs it: --paged runs without it)

BACKENDS = ("flash", "efficient", "cudnn", "math")
COLUMNS = ["batch", "heads_q", "heads_k", "seq_q", "seq_k", "tuned_config", "tuned_gbps", "pct_of_copy_peak",
           "best_torch_backend", "ratio_vs_best_torch",
           # what the figures above come from
           "device", "head_dim", "dtype", "causal", "tuned_status", "tuned_ms", "copy_gbps"] + \
          [f"torch_{b}_gbps" for b in BACKENDS] + ["torch_notes"]


def gbps(p, ms):
    return baselines.bytes_moved(p) / (ms * 1e-3) / 1e9 if ms > 0 else 0.0


def release():
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the next measurement (another process, or a larger tensor) gets the memory


# --paged ------------------------------------------------------------------------------------------------------

PAGED_COLUMNS = ["batch", "heads_q", "heads_k", "seq_q", "seq_k", "page_size", "paged_config", "paged_gbps",
                 "dense_config", "dense_gbps", "ratio_paged_vs_dense", "dense_config_paged_gbps",
                 "ratio_same_config",
                 # what the figures above come from
                 "device", "head_dim", "dtype", "causal", "paged_ms", "dense_ms", "dense_config_paged_ms",
                 "paged_status", "dense_status", "dense_config_paged_status"]


def load_paged_points(ft, path):
    """The paged problems of a problem set as flashtune reads them (`flashtune problems --json`)."""
    out = subprocess.run([ft, "problems", path, "--json"], capture_output=True, text=True, check=True).stdout
    return [p for p in json.loads(out) if "paged" in p]


def run_command(ft, family, p, selector, paged):
    """`flashtune run` of point p: --best or --params (selector), on its paged cache or on contiguous K/V."""
    cmd = [ft, "run", "--family", family, "--shape", f"{p['batch']},{p['heads']},{p['seq_q']},{p['seq_k']},{p['head_dim']}",
           "--dtype", p["dtype"], "--json", *selector]
    if p["causal"]:
        cmd.append("--causal")
    if "heads_k" in p:
        cmd += ["--heads-k", str(p["heads_k"])]
    if paged:
        cmd += ["--paged", json.dumps(p["paged"], separators=(",", ":"))]
    return cmd


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "error": (r.stderr or r.stdout).strip()[:200], "config": ""}


def block_n(config):
    """BLOCK_N of a decode_splitkv config string ("SPLITS=16,BLOCK_N=64,..."), or 0."""
    kv = dict(item.split("=") for item in config.split(",") if "=" in item)
    return int(kv.get("BLOCK_N", 0))


def paged_row(p, paged, dense, same, device):
    """One CSV row from the three runs' JSON (same: the dense pick's config on the paged cache, or None when it is
    the paged pick's config or cannot read the pages). GB/s as the worker reports them (Problem::bytes)."""
    def ok(r):
        return r is not None and r.get("status") == "ok"

    def gbps(r):
        return r.get("gbps", 0.0) if ok(r) else 0.0

    def status(r):
        if r is None:
            return ""
        first = (str(r.get("error", "")).splitlines() or [""])[0]  # a CSV cell of one line
        return r["status"] + ("" if ok(r) else ": " + first[:120])

    same_run = same if same is not None else (paged if ok(paged) and ok(dense) and paged.get("config") == dense.get("config") else None)
    pg, dn, sm = gbps(paged), gbps(dense), gbps(same_run)
    return dict(batch=p["batch"], heads_q=p["heads"], heads_k=p.get("heads_k", p["heads"]), seq_q=p["seq_q"], seq_k=p["seq_k"],
                page_size=p["paged"]["page_size"], paged_config=paged.get("config", ""), paged_gbps=f"{pg:.1f}",
                dense_config=dense.get("config", ""), dense_gbps=f"{dn:.1f}",
                ratio_paged_vs_dense=f"{pg / dn:.3f}" if pg > 0 and dn > 0 else "",
                dense_config_paged_gbps=f"{sm:.1f}" if sm > 0 else "",
                ratio_same_config=f"{sm / dn:.3f}" if sm > 0 and dn > 0 else "",
                device=device, head_dim=p["head_dim"], dtype=p["dtype"], causal=int(p["causal"]),
                paged_ms=f"{paged.get('ms_median', 0.0):.4f}" if ok(paged) else "",
                dense_ms=f"{dense.get('ms_median', 0.0):.4f}" if ok(dense) else "",
                dense_config_paged_ms=f"{same_run.get('ms_median', 0.0):.4f}" if ok(same_run) else "",
                paged_status=status(paged), dense_status=status(dense),
                dense_config_paged_status=status(same) if same is not None else ("the paged pick" if same_run is not None else ""))


def main_paged(a):
    points = load_paged_points(a.flashtune, a.problems)
    if not points:
        sys.exit(f"{a.problems}: no paged problems")
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=PAGED_COLUMNS)
        w.writeheader()
        for p in points:
            best = ["--best", "--db", a.db]
            paged = run_json(run_command(a.flashtune, a.family, p, best, True))
            dense = run_json(run_command(a.flashtune, a.family, p, best, False))
            same = None  # the dense pick on the paged cache, where it differs from the paged pick and can read the pages
            if dense.get("status") == "ok" and dense.get("config") != paged.get("config") and \
                    p["paged"]["page_size"] % max(block_n(dense["config"]), 1) == 0:
                same = run_json(run_command(a.flashtune, a.family, p, ["--params", dense["config"], "--db", a.db], True))
            device = paged.get("device") or dense.get("device", "")
            row = paged_row(p, paged, dense, same, device)
            w.writerow(row)
            fh.flush()
            print(" ".join(f"{k}={row[k]}" for k in PAGED_COLUMNS[:13]), file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default="decode_splitkv")
    ap.add_argument("--flashtune", default="build/flashtune")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--paged", action="store_true", help="paged picks against dense picks (no torch)")
    a = ap.parse_args()
    if a.paged:
        return main_paged(a)
    import torch
    import sdpa_baseline
    from tuned_vs_sdpa import flashtune_run
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
