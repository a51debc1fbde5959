#!/usr/bin/env python3
"""The forward beside its peers in one process, GPU kernel time: per point of the problem sets, the forward of
flashtune's PyTorch op (what the runtime picks from --db; fa3_wgmma on Hopper), torch SDPA's flash and cuDNN
backends and the FA3-class kernel (FlashAttention-4's sm90 path, flash_attn.cute; skipped with a note where it
is not installed).

Timer, the same for every implementation (kernel_timer.py): the sum of the durations of the kernels one
forward call launches, read from torch.profiler; L2 flushed and synchronised before each call, outside the
profiled window; warm-up calls first; the median of --reps calls. Inputs seeded N(0, 1), [B, H, S, d] (FA4:
[B, S, H, d], the transposes made outside the timed call), no autograd graph. Each output is checked against
torch SDPA's (flash, cuDNN or efficient) before anything is timed: max |ours - torch| is a column.
Forward FLOPs = 4 B H Sq Sk d (halved causal).

usage: fwd_peers.py [--db reports/<gpu>/results.db] --problems A.json [B.json ...] --out fwd_op_vs_peers.csv
       (FLASHTUNE_LIBRARY and PYTHONPATH=python if the package is not installed)
"""
import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402
from kernel_timer import fa3_class_forward, kernel_breakdown, kernel_ms, l2_flush  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

KEYS = ["device", "head_dim", "causal", "seq", "batch", "heads", "heads_k", "tuned_family", "tuned_config",
        "tuned_ms", "tuned_tflops", "max_abs_vs_torch", "fa4_tflops", "cudnn_tflops", "flash_tflops",
        "ratio_vs_fa4", "ratio_vs_cudnn", "ratio_vs_flash"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="the store the runtime reads ($FLASHTUNE_DB); without it, the runtime's own tables "
                                 "(what a user's call runs)")
    ap.add_argument("--problems", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=20261128)
    a = ap.parse_args()
    if a.db is not None:
        if not os.path.isfile(a.db):
            sys.exit(f"fwd_peers: no store at {a.db}")
        os.environ["FLASHTUNE_DB"] = a.db
    else:
        os.environ.pop("FLASHTUNE_DB", None)
    import flashtune.torch as ftt

    fa4_func = fa3_class_forward()
    flush = l2_flush()
    problems = [p for f in a.problems for p in baselines.load_problems(json.load(open(f)))]
    problems = [p for p in problems if p["direction"] == "fwd"]
    device = torch.cuda.get_device_name(0)
    out = open(a.out, "w", newline="")  # a row per point as it is measured: a run cut by its time limit keeps them
    w = csv.DictWriter(out, fieldnames=KEYS)
    w.writeheader()
    kout = open(os.path.splitext(a.out)[0] + "_kernels.csv", "w", newline="")
    kw = csv.writer(kout)
    kw.writerow(["head_dim", "causal", "seq", "heads", "heads_k", "impl", "kernel", "us"])

    for p in problems:
        B, H, S, Sk, d = p["batch"], p["heads"], p["seq_q"], p["seq_k"], p["head_dim"]
        Hk = p.get("heads_k", H)
        causal = bool(p["causal"])
        dt = torch.bfloat16 if p["dtype"] == "bf16" else torch.float16
        g = torch.Generator(device="cuda").manual_seed(a.seed)
        q = torch.randn(B, H, S, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)
        fl = baselines.flops(p)
        row = {"device": device, "head_dim": d, "causal": int(causal), "seq": S, "batch": B, "heads": H, "heads_k": Hk}

        def tf(ms):
            return fl / (ms * 1e-3) / 1e12

        def timed(impl, call):
            ms, _ = kernel_ms(call, flush, a.reps)
            for name, us in kernel_breakdown(call, flush):
                kw.writerow([d, int(causal), S, H, Hk, impl, name[:160], f"{us:.1f}"])
            kout.flush()
            return ms

        with torch.no_grad():
            ours = lambda: ftt.attention(q, k, v, causal=causal)  # noqa: E731
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hk != H)
            row["max_abs_vs_torch"] = f"{(ours().float() - ref.float()).abs().max().item():.3g}"
            del ref
            ms = timed("flashtune", ours)
            info = ftt.explain(q, k, v, causal=causal)  # the forward's pick at the top level
            row["tuned_ms"], row["tuned_tflops"] = f"{ms:.4f}", f"{tf(ms):.1f}"
            row["tuned_family"], row["tuned_config"] = info.get("family", ""), info.get("config", info.get("error", ""))
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                row[f"{name}_tflops"] = ""
                try:
                    def sdpa(backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hk != H)
                    row[f"{name}_tflops"] = f"{tf(timed(name, sdpa)):.1f}"
                except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a result
                    print(f"{name} {p}: {type(e).__name__}: {e}", file=sys.stderr)
            row["fa4_tflops"] = ""
            if fa4_func is not None:
                try:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    row["fa4_tflops"] = f"{tf(timed('fa4', lambda: fa4_func(qt, kt, vt, causal=causal))):.1f}"
                    del qt, kt, vt
                except Exception as e:  # noqa: BLE001
                    print(f"fa4 {p}: {type(e).__name__}: {e}", file=sys.stderr)
        ours_tf = float(row["tuned_tflops"])
        for peer in ("fa4", "cudnn", "flash"):
            row[f"ratio_vs_{peer}"] = f"{ours_tf / float(row[peer + '_tflops']):.3f}" if row[f"{peer}_tflops"] else ""
        w.writerow(row)
        out.flush()
        print(f"d {d} causal {int(causal)} S {S} H {H}/{Hk}: ours {row['tuned_tflops']} ({row['tuned_family']} "
              f"{row['tuned_config']}) fa4 {row['fa4_tflops']} cudnn {row['cudnn_tflops']} flash {row['flash_tflops']}",
              file=sys.stderr)
        del q, k, v
        torch.cuda.empty_cache()
    out.close()
    kout.close()


if __name__ == "__main__":
    main()
