#!/usr/bin/env python3
"""Time torch SDPA with one backend forced on the shapes of a flashtune problems file.

Same conventions as the flashtune worker: fresh seeded normal inputs, a warm-up, an L2 flush
before every timed repeat, CUDA events around the call alone, median and p20/p80 of the repeats,
FLOPs counted as FlashAttention does (4*B*H*Sq*Sk*d, halved when causal). Rows go to a CSV.

usage: sdpa_baseline.py problems.json --backend efficient --out sdpa.csv [--reps 30]
"""
import argparse
import csv
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402

BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# Problem sets and FLOP counts: one implementation, shared with the experiment baselines.
expand = baselines.load_problems
flops = baselines.flops


def time_cuda(run, reps, warmup=3, flush=None, before_each=None):
    """Warm-up calls, then per repeat an L2 flush (`flush` rewritten; default: a buffer of twice the L2),
    `before_each()` if given (queued work the events do not see), and CUDA events around `run` alone:
    (median, p20, p80) in ms."""
    if flush is None:
        flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda",
                            dtype=torch.float32)
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        flush.fill_(float(i))
        if before_each is not None:
            before_each()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    t = torch.tensor(times)
    # One median (core/timing.hpp): linear-interpolation quantiles of the same samples. torch's median()
    # is the lower of the two middle samples, another definition, so quantile(0.5).
    return t.quantile(0.5).item(), t.quantile(0.2).item(), t.quantile(0.8).item()


def time_copy(nbytes, reps):
    """A device-to-device copy of nbytes (nbytes read, nbytes written), timed as time_cuda does."""
    src = torch.ones(nbytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    return time_cuda(lambda: dst.copy_(src), reps)


def time_sdpa(p, backend, reps, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = DTYPES[p["dtype"]]
    shape_q = (p["batch"], p["heads"], p["seq_q"], p["head_dim"])
    shape_k = (p["batch"], p.get("heads_k", p["heads"]), p["seq_k"], p["head_dim"])
    gqa = {"enable_gqa": True} if "heads_k" in p else {}  # grouped-query attention: torch's own GQA path
    q = torch.randn(shape_q, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(shape_k, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(shape_k, device="cuda", dtype=dt, generator=gen)
    # torch's is_causal is top-left aligned; equal lengths here, where both conventions agree.
    assert not p["causal"] or p["seq_q"] == p["seq_k"], "causal baseline needs Sq == Sk"
    with sdpa_kernel([BACKENDS[backend]]):
        if p.get("direction", "fwd") == "bwd":
            # The backward alone: one forward builds the graph, each timed call replays its backward.
            for t in (q, k, v):
                t.requires_grad_(True)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], **gqa)
            dout = torch.randn_like(out)
            run = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], **gqa)
        return time_cuda(run, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems")
    ap.add_argument("--backend", choices=BACKENDS, default="efficient")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    a = ap.parse_args()
    problems = expand(json.load(open(a.problems)))
    device = torch.cuda.get_device_name(0)
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "impl", "direction", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype", "causal",
                    "ms_median", "ms_p20", "ms_p80", "tflops", "status", "heads_k"])
        for p in problems:
            try:
                med, p20, p80 = time_sdpa(p, a.backend, a.reps, a.seed)
                status, tf = "ok", flops(p) / (med * 1e-3) / 1e12
            except Exception as e:  # a backend that refuses a shape is a result, not a crash
                med = p20 = p80 = tf = 0.0
                status = f"error: {type(e).__name__}: {str(e)[:120]}"
            w.writerow([device, f"torch_sdpa_{a.backend}", p["direction"], p["batch"], p["heads"], p["seq_q"], p["seq_k"],
                        p["head_dim"], p["dtype"], int(p["causal"]), f"{med:.6f}", f"{p20:.6f}", f"{p80:.6f}",
                        f"{tf:.3f}", status, p.get("heads_k", p["heads"])])
            print(f"sdpa {a.backend} {p}: {med:.3f} ms {tf:.1f} TFLOP/s {status}", file=sys.stderr)


if __name__ == "__main__":
    main()
