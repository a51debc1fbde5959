#!/usr/bin/env python3
"""Host time of flashtune.torch.attention's forward (one call, from a synchronised device to its return, median of
50) with one property of the call changed at a time: q, k, v contiguous or views of one qkv projection, grad
recorded or not, autocast or not; SDPA beside each. Places where a training step's forward spends host time.

usage: python3 experiments/probes/host_fwd_variants.py [B,H,S,d]   (default 8,8,2048,64, bf16, causal)"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_time  # noqa: E402  (its timer; it sets the library defaults before flashtune loads)
from flashtune import torch as ftt  # noqa: E402


def host_us(fn, n=50):
    """host_time.py's timer after five warm-up calls."""
    for _ in range(5):
        fn()
    return host_time.host_us(fn, n)


def main():
    B, H, S, d = map(int, (sys.argv[1] if len(sys.argv) > 1 else "8,8,2048,64").split(","))
    x = torch.randn(B, S, 3 * H * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xc = torch.randn(3, B, H, S, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    print(f"backend {ftt.backend()}; B={B} H={H} S={S} d={d} bf16 causal; forward only, host us (median of 50)")
    attn = {"flashtune": lambda q, k, v: ftt.attention(q, k, v, causal=True),
            "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for views in (True, False):
        for grad in (True, False):
            for autocast in (True, False):
                res = []
                for name, f in attn.items():
                    def call():
                        with torch.set_grad_enabled(grad), torch.autocast("cuda", dtype=torch.bfloat16,
                                                                          enabled=autocast):
                            q, k, v = x.view(B, S, 3, H, d).permute(2, 0, 3, 1, 4) if views else xc.unbind(0)
                            f(q, k, v)
                    res.append(f"{name} {host_us(call):7.1f}")
                print(f"  {'qkv views ' if views else 'contiguous'} grad={grad!s:<5} autocast={autocast!s:<5}  "
                      + "   ".join(res))
    q, k, v = x.view(B, S, 3, H, d).permute(2, 0, 3, 1, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            ftt.attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    print("  views, grad, no autocast, self CPU per call under the profiler: " + ", ".join(
        f"{e.key} {e.self_cpu_time_total / 20:.0f} us x{e.count / 20:g}"
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]))


if __name__ == "__main__":
    main()
