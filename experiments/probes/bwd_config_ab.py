#!/usr/bin/env python3
"""Backward configs of one bucket timed as bwd_peers.py times the op (profiler kernel time, L2 flushed, a
synchronised pause before each call), in rotated order over rounds, each config in a process of its own whose
store (FLASHTUNE_DB) holds that config alone at the bucket: where the harness's sweep, whose repeats run back to
back under the power cap, ranks finalists within its spread, this says how they rank in the peers' regime.

usage: bwd_config_ab.py --db STORE --shape B,H,S,D [--heads-k HK] [--causal] --configs "CFG;CFG;..." --out OUT.csv
       [--rounds 3] [--reps 10]
Each config must have an ok row at the bucket in STORE (validated there); the other rows of the bucket's
(family, head dim, causal, dtype, seq) are dropped from the process's copy.
"""
import argparse
import csv
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def one(a):
    """Child: time the op's backward with the store in FLASHTUNE_DB; print ms and the config explain() names."""
    sys.path.insert(0, os.path.dirname(HERE))
    from kernel_timer import kernel_ms, l2_flush
    import torch
    import flashtune.torch as ftt
    B, H, S, D = (int(x) for x in a.shape.split(","))
    hk = a.heads_k or H
    g = torch.Generator(device="cuda").manual_seed(20261127)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(B, hk, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(B, hk, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    o = ftt.attention(q, k, v, causal=a.causal)
    ms, _ = kernel_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), l2_flush(), a.reps)
    print(f"{ms:.5f} {ftt.explain(q, k, v, causal=a.causal)['backward'].get('config', '?')}")


def store_for(src, dst, cfg, a):
    """src with the bucket's rows of other configs dropped."""
    B, H, S, D = (int(x) for x in a.shape.split(","))
    shutil.copy(src, dst)
    os.chmod(dst, 0o644)
    c = sqlite3.connect(dst)
    where = "direction = 'bwd' and dtype = 'bf16' and head_dim = ? and causal = ? and seq_q = ?"
    if not c.execute(f"select count(*) from results where {where} and config = ? and status = 'ok'",
                     (D, int(a.causal), S, cfg)).fetchone()[0]:
        sys.exit(f"bwd_config_ab: no ok row of {cfg} at d {D} causal {int(a.causal)} S {S} in {src}")
    c.execute(f"delete from results where {where} and config != ?", (D, int(a.causal), S, cfg))
    c.commit()
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--heads-k", type=int, default=0)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--configs")
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one(a)
    if not (a.db and a.configs and a.out):
        ap.error("--db, --configs and --out are required")
    configs = [c for c in a.configs.split(";") if c]
    tmp = tempfile.mkdtemp(prefix="bwd_ab_")
    stores = []
    for i, cfg in enumerate(configs):
        stores.append(os.path.join(tmp, f"s{i}.db"))
        store_for(a.db, stores[-1], cfg, a)
    times = {c: [] for c in configs}
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["shape", "heads_k", "causal", "round", "config", "ms", "explained_config"])
        for r in range(a.rounds):
            for j in range(len(configs)):
                i = (j + r) % len(configs)  # rotated: each config at every position once over len(configs) rounds
                cmd = [sys.executable, os.path.abspath(__file__), "--one", "--shape", a.shape, "--heads-k",
                       str(a.heads_k), "--reps", str(a.reps)] + (["--causal"] if a.causal else [])
                p = subprocess.run(cmd, env=dict(os.environ, FLASHTUNE_DB=stores[i]), capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"{configs[i]}: {p.stderr.strip()[-300:]}", file=sys.stderr)
                    continue
                ms, explained = p.stdout.split()[-2:]
                times[configs[i]].append(float(ms))
                w.writerow([a.shape, a.heads_k, int(a.causal), r, configs[i], ms, explained])
                f.flush()
    for c in configs:
        if times[c]:
            print(f"{statistics.median(times[c]):.4f} ms median of {len(times[c])}  {c}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
