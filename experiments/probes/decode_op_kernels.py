#!/usr/bin/env python3
"""Probe: decoding through flashtune.torch.attention, its kernels' GPU time (torch.profiler, L2 flushed before each
call) against the whole call's CUDA-event time, and torch SDPA cuDNN's kernels the same way, at a few decoding points
(Hq 32, Hk 8, d 128, Sq 1, bf16): where the op's call time goes (issue 31's decode_op_vs_peers.csv).

usage: decode_op_kernels.py [--points 64x4096,64x32768,8x32768,1x4096] [--reps 10]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="64x4096,64x32768,8x32768,8x131072,1x4096")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    import flashtune.torch as ftt
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
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
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                calls = []
                for _ in range(a.reps):
                    scratch.zero_()
                    torch.cuda.synchronize()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    calls.append(s.elapsed_time(e) * 1e3)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(a.reps):
                        scratch.zero_()
                        fn()
                    torch.cuda.synchronize()
                names = {}
                for ev in prof.events():
                    if ev.device_type == torch.autograd.DeviceType.CUDA and "zero" not in ev.name and "fill" not in ev.name.lower():
                        names.setdefault(ev.name[:60], []).append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
                kern = sum(sum(v) for v in names.values()) / a.reps
                print(f"{pt},{name},{statistics.median(calls):.1f},{kern:.1f},\"{'; '.join(f'{n} x{len(v)}' for n, v in names.items())}\"",
                      flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
