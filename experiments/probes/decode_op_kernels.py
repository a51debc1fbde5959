#!/usr/bin/env python3
"""Probe: decoding through flashtune.torch.attention, its kernels' GPU time (kernel_timer.kernel_ms: torch.profiler,
L2 flushed before each call) against the whole call's CUDA-event time (decode_op_peers.call_times), and torch SDPA
cuDNN's kernels the same way, at a few decoding points (Hq 32, Hk 8, d 128, Sq 1, bf16): where the op's call time
goes (issue 31's decode_op_vs_peers.csv). The kernels column names one call's kernels (kernel_breakdown).

usage: decode_op_kernels.py [--points 64x4096,64x32768,8x32768,8x131072,1x4096] [--reps 10]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from decode_op_peers import call_times  # noqa: E402
from kernel_timer import kernel_breakdown, kernel_ms, l2_flush  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="64x4096,64x32768,8x32768,8x131072,1x4096")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    import flashtune.torch as ftt
    flush = l2_flush()
    H, Hk, d, dt = 32, 8, 128, torch.bfloat16
    print("point,impl,call_us,kernel_us,kernels")
    for pt in a.points.split(","):
        B, Sk = map(int, pt.split("x"))
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, 1, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        for name, fn in (("flashtune", lambda: ftt.attention(q, k, v)), ("cudnn", cudnn)):
            with torch.no_grad():
                kern_ms, _ = kernel_ms(fn, flush, a.reps)  # its warm-up calls first
                call_us = statistics.median(call_times(fn, flush, a.reps))
                kernels = "; ".join(f"{n[:60]} {us:.1f}" for n, us in kernel_breakdown(fn, flush))
            print(f"{pt},{name},{call_us:.1f},{kern_ms * 1e3:.1f},\"{kernels}\"", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
