#!/usr/bin/env python3
"""Host time of flashtune.torch.attention beside torch SDPA (flash backend): bf16, causal; each call timed from a
synchronised device to its return (median of 50), so the figure is what a step spends on the host before the GPU
has work, not kernel time. For each shape: the forward under no_grad and the forward + backward
(torch.autograd.grad), through the backend flashtune.torch picked (backend(): the compiled extension where built)
and through the ctypes fallback's ops, then the forward's pieces (the op alone, the runtime's C call through ctypes).

usage: python3 experiments/probes/host_time.py [--csv OUT.csv] [B,H,S,d ...]   (default 4,16,4096,128 16,16,1024,128)
The CSV has one row per shape and direction: op, flashtune_us, sdpa_us (issue 31's bounds: forward <= 10 us,
forward + backward <= SDPA's).
"""
import argparse
import csv
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("FLASHTUNE_LIBRARY", os.path.join(ROOT, "build", "runtime", "libflashtune_attention.so"))
_EXT = os.path.join(ROOT, "build", "python", "csrc", "libflashtune_torch.so")
if os.path.isfile(_EXT):
    os.environ.setdefault("FLASHTUNE_TORCH_LIBRARY", _EXT)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from flashtune import _lib  # noqa: E402
from flashtune import torch as ftt  # noqa: E402


def host_us(fn, n=50):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2]


def probe(B, H, S, d, causal=True):
    print(f"\n=== B={B} H={H} S={S} d={d} causal={causal} bf16; flashtune.torch backend: {ftt.backend()}")
    q, k, v, do = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def step():
        o = ftt.attention(q, k, v, causal=causal)
        torch.autograd.grad(o, (q, k, v), do)

    def ctypes_step():  # the fallback's eager path, whichever backend is loaded
        o, _ = ftt._EagerAttention.apply(q, k, v, causal, 0.0, False, ftt.NO_MODS)
        torch.autograd.grad(o, (q, k, v), do)

    def sdpa_step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(o, (q, k, v), do)

    for f in (step, ctypes_step):
        for _ in range(3):
            f()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for _ in range(3):
            sdpa_step()
        sdpa_fb = host_us(sdpa_step)
        with torch.no_grad():
            sdpa_f = host_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    ft_fb = host_us(step)
    with torch.no_grad():
        ft_f = host_us(lambda: ftt.attention(q, k, v, causal=causal))
        ct_f = host_us(lambda: ftt._EagerAttention.apply(q, k, v, causal, 0.0, False, ftt.NO_MODS))
    ct_fb = host_us(ctypes_step)
    print(f"forward (no grad)      flashtune {ft_f:8.1f} us   ctypes path {ct_f:8.1f} us   sdpa flash {sdpa_f:8.1f} us")
    print(f"forward + backward     flashtune {ft_fb:8.1f} us   ctypes path {ct_fb:8.1f} us   sdpa flash {sdpa_fb:8.1f} us")

    # The forward's pieces: the op called directly (no Python wrapper), the runtime's C call alone (ctypes,
    # arguments packed beforehand), torch.empty from Python, and the cost of calling any op through torch.ops.
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o = torch.empty_like(qd)
    lse = torch.empty((B, H, S), dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    fa = ftt._fwd_args(qd, kd, vd, o, lse, causal, 0.0)
    pieces = [("runtime C call via ctypes (ft_attention_forward)", lambda: _lib.forward(fa, stream)),
              ("ft_explain_forward (plan only, via ctypes)", lambda: _lib.explain_forward(fa)),
              ("torch.empty x2 from Python", lambda: (torch.empty_like(qd), torch.empty_like(lse))),
              ("torch.ops.aten.empty_like.default (an op call's floor)", lambda: torch.ops.aten.empty_like.default(qd))]
    def under_autocast(fn):
        def call():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                fn()
        return call
    pieces += [("Python _check under autocast (before: every call)", under_autocast(lambda: ftt._check(qd, kd, vd, "p", True))),
               ("_autocast_cast under autocast (now)", under_autocast(lambda: ftt._autocast_cast(qd, kd, vd))),
               ("autocast context alone", under_autocast(lambda: None))]
    if ftt._EXT:
        op = torch.ops.flashtune.attention_fwd.default
        pieces.insert(0, ("op torch.ops.flashtune.attention_fwd.default", lambda: op(qd, kd, vd, causal, 0.0)))
    for name, fn in pieces:
        print(f"  {name:<52} {host_us(fn):8.1f} us")
    shape = f"{B}x{H}x{S}x{d} {'causal ' if causal else ''}bf16"
    return [(f"forward {shape}", ft_f, sdpa_f), (f"forward+backward {shape}", ft_fb, sdpa_fb)]


def training_like(B, H, S, d, causal=True):
    """As examples/train_tiny_gpt.py calls the op: q, k, v views of one qkv projection ([B, S, 3, H, d] permuted,
    not contiguous), under bf16 autocast, the gradient arriving through a transpose (not contiguous either); SDPA
    with its default backend choice, as the example runs it. Then the same step with one thing changed at a time
    (q, k, v made contiguous first; no autocast; the forward alone), to place the difference."""
    print(f"\n=== training-like: B={B} H={H} S={S} d={d} causal={causal}, qkv views, bf16 autocast")
    x = torch.randn(B, S, 3 * H * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, S, H * d, device="cuda", dtype=torch.bfloat16)

    def run(attn, contiguous=False, autocast=True, backward=True, profile=True):
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                q, k, v = x.view(B, S, 3, H, d).permute(2, 0, 3, 1, 4)
                if contiguous:
                    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                y = attn(q, k, v).transpose(1, 2).reshape(B, S, H * d)
            if backward:
                torch.autograd.grad(y, x, g)
        for _ in range(3):
            step()
        us = host_us(step)
        if profile:  # the step's GPU time beside its host time: a host time near it says the step waits for the GPU
            gpu = []
            for _ in range(20):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                e0.record()
                step()
                e1.record()
                torch.cuda.synchronize()
                gpu.append(e0.elapsed_time(e1) * 1e3)
            print(f"   host {us:.1f} us, GPU (events around the step) {sorted(gpu)[10]:.1f} us")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    step()
            torch.cuda.synchronize()
            rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
            print("   self CPU per step (under the profiler):  " +
                  ", ".join(f"{e.key} {e.self_cpu_time_total / 20:.0f} us x{e.count / 20:g}" for e in rows))
            # What waits for the GPU inside a step (a host time near the kernels' time says something does).
            waits = [e for e in prof.key_averages() if any(w in e.key for w in ("Synchronize", "Memcpy", "EventQuery",
                                                                                 "cuMemAlloc", "cudaMalloc", "cuMemFree"))]
            print("   waits and allocations per step:  " + (", ".join(
                f"{e.key} {e.self_cpu_time_total / 20:.0f} us x{e.count / 20:g}" for e in waits) or "none"))
        return us

    ft_attn = lambda q, k, v: ftt.attention(q, k, v, causal=causal)  # noqa: E731
    sd_attn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    ft, sd = run(ft_attn), run(sd_attn)
    print(f"forward + backward     flashtune {ft:8.1f} us   sdpa (default backend) {sd:8.1f} us")
    for name, kw in (("q, k, v contiguous first", dict(contiguous=True)), ("no autocast", dict(autocast=False)),
                     ("forward only (no backward)", dict(backward=False))):
        print(f"  {name:<28} flashtune {run(ft_attn, profile=False, **kw):8.1f} us   "
              f"sdpa {run(sd_attn, profile=False, **kw):8.1f} us")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q, k, v = x.view(B, S, 3, H, d).permute(2, 0, 3, 1, 4)
        ex = ftt.explain(q, k, v, causal=causal)
    print("  explain:", {k_: ex.get(k_) for k_ in ("family", "source", "cache")},
          "backward:", {k_: ex.get("backward", {}).get(k_) for k_ in ("family", "source", "cache")})
    return [(f"forward+backward training-like {B}x{H}x{S}x{d} {'causal ' if causal else ''}bf16 autocast", ft, sd)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="write op, flashtune_us, sdpa_us here")
    ap.add_argument("shapes", nargs="*", default=["4,16,4096,128", "16,16,1024,128"])
    a = ap.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for s in a.shapes:
        rows += probe(*map(int, s.split(",")))
    for s in a.shapes:
        rows += training_like(*map(int, s.split(",")))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["op", "flashtune_us", "sdpa_us"])
            for op, ft, sd in rows:
                w.writerow([op, f"{ft:.1f}", f"{sd:.1f}"])
        print(f"wrote {a.csv}")


if __name__ == "__main__":
    main()
