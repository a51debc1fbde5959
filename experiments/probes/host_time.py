#!/usr/bin/env python3
"""Where the host time of flashtune.torch.attention goes (forward + backward, bf16): each layer timed
on its own after a synchronisation (median of 50), torch SDPA flash beside it, then cProfile and
torch.profiler (CPU + CUDA driver API) over a few calls.

usage: python3 experiments/probes/host_time.py [B,H,S,d ...]   (default 4,16,4096,128 16,16,1024,128)
"""
import cProfile
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("FLASHTUNE_LIBRARY", os.path.join(ROOT, "build", "runtime", "libflashtune_attention.so"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from flashtune import _lib  # noqa: E402
from flashtune import torch as ftt  # noqa: E402


def host_ms(fn, n=50):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2]


class _Nop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def probe(B, H, S, d, causal=True):
    print(f"\n=== B={B} H={H} S={S} d={d} causal={causal} bf16")
    q, k, v, do = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def step():
        o = ftt.attention(q, k, v, causal=causal)
        torch.autograd.grad(o, (q, k, v), do)

    def sdpa_step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(o, (q, k, v), do)

    for _ in range(3):
        step()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for _ in range(3):
            sdpa_step()
        print(f"sdpa flash fwd+bwd host          {host_ms(sdpa_step):8.3f} ms")
    print(f"flashtune fwd+bwd host           {host_ms(step):8.3f} ms")
    with torch.no_grad():
        print(f"flashtune fwd (no grad) host     {host_ms(lambda: ftt.attention(q, k, v, causal=causal)):8.3f} ms")
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o = torch.empty_like(qd)
    lse = torch.empty((B, H, S), dtype=torch.float32, device="cuda")
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    stream = torch.cuda.current_stream().cuda_stream
    fa = ftt._fwd_args(qd, kd, vd, o, lse, causal, 0.0)
    ba = ftt._bwd_args(do, qd, kd, vd, o, lse, dq, dk, dv, causal, 0.0)
    print(f"  args packing fwd (ctypes)      {host_ms(lambda: ftt._fwd_args(qd, kd, vd, o, lse, causal, 0.0)):8.3f} ms")
    print(f"  args packing bwd (ctypes)      {host_ms(lambda: ftt._bwd_args(do, qd, kd, vd, o, lse, dq, dk, dv, causal, 0.0)):8.3f} ms")
    print(f"  ft_explain_forward (plan only) {host_ms(lambda: _lib.explain_forward(fa)):8.3f} ms")
    print(f"  ft_explain_backward            {host_ms(lambda: _lib.explain_backward(ba)):8.3f} ms")
    print(f"  ft_attention_forward           {host_ms(lambda: _lib.forward(fa, stream)):8.3f} ms")
    print(f"  ft_attention_backward          {host_ms(lambda: _lib.backward(ba, stream)):8.3f} ms")
    print(f"  torch.empty x5                 {host_ms(lambda: [torch.empty_like(qd) for _ in range(5)]):8.3f} ms")

    # The forward's host path piece by piece (perf_counter marks inside a copy of _forward_impl).
    marks = {}

    def fwd_marked():
        t = [time.perf_counter()]
        qq, kk, vv = ftt._check(q, k, v, "probe", autocast=True)
        t.append(time.perf_counter())
        oo = torch.empty((B, H, S, d), dtype=qq.dtype, device=qq.device)
        ll = torch.empty((B, H, S), dtype=torch.float32, device=qq.device)
        t.append(time.perf_counter())
        qq, kk, vv = (ftt._runtime_layout(x) for x in (qq, kk, vv))
        t.append(time.perf_counter())
        with torch.cuda.device(qq.device):
            t.append(time.perf_counter())
            args = ftt._fwd_args(qq, kk, vv, oo, ll, causal, 0.0)
            t.append(time.perf_counter())
            st = ftt._stream(qq.device)
            t.append(time.perf_counter())
            _lib.forward(args, st)
            t.append(time.perf_counter())
        t.append(time.perf_counter())
        for i, name in enumerate(("check", "empty", "layout", "device enter", "pack", "stream", "C call", "device exit")):
            marks.setdefault(name, []).append((t[i + 1] - t[i]) * 1e3)

    with torch.no_grad():
        print(f"  forward, marked, total         {host_ms(fwd_marked):8.3f} ms")
    for name, ts in marks.items():
        print(f"    {name:<28} {sorted(ts)[len(ts) // 2]:8.4f} ms")
    bmarks = {}

    def bwd_marked():
        t = [time.perf_counter()]
        dq_ = torch.empty(qd.shape, dtype=qd.dtype, device=qd.device)
        dk_ = torch.empty(kd.shape, dtype=kd.dtype, device=kd.device)
        dv_ = torch.empty(vd.shape, dtype=vd.dtype, device=vd.device)
        t.append(time.perf_counter())
        dd = ftt._runtime_layout(do.to(device=qd.device, dtype=qd.dtype))
        oo = ftt._runtime_layout(o.to(dtype=qd.dtype))
        t.append(time.perf_counter())
        qq, kk, vv = (ftt._runtime_layout(x) for x in (qd, kd, vd))
        ll = lse.to(device=qd.device, dtype=torch.float32).contiguous()
        t.append(time.perf_counter())
        with torch.cuda.device(qq.device):
            t.append(time.perf_counter())
            args = ftt._bwd_args(dd, qq, kk, vv, oo, ll, dq_, dk_, dv_, causal, 0.0)
            t.append(time.perf_counter())
            st = ftt._stream(qq.device)
            t.append(time.perf_counter())
            _lib.backward(args, st)
            t.append(time.perf_counter())
        t.append(time.perf_counter())
        for i, name in enumerate(("empty x3", "dout/o layout", "qkv layout, lse", "device enter", "pack", "stream",
                                  "C call", "device exit")):
            bmarks.setdefault(name, []).append((t[i + 1] - t[i]) * 1e3)

    print(f"  backward, marked, total        {host_ms(bwd_marked):8.3f} ms")
    for name, ts in bmarks.items():
        print(f"    {name:<28} {sorted(ts)[len(ts) // 2]:8.4f} ms")
    print(f"  _backward_impl, main thread    {host_ms(lambda: ftt._backward_impl(do, qd, kd, vd, o, lse, causal, 0.0)):8.3f} ms")
    orig = ftt._backward_impl
    inner = []

    def timed_backward(*a):
        t0 = time.perf_counter()
        r = orig(*a)
        inner.append((time.perf_counter() - t0) * 1e3)
        return r

    ftt._backward_impl = timed_backward
    print(f"  step with the backward timed   {host_ms(step):8.3f} ms; _backward_impl in the engine thread "
          f"{sorted(inner)[len(inner) // 2]:8.3f} ms")
    ftt._backward_impl = orig
    with torch.no_grad():
        print(f"  Function.apply, no work        {host_ms(lambda: _Nop.apply(q)):8.3f} ms")

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        torch.cuda.synchronize()
        step()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.cuda.synchronize()
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


def main():
    shapes = sys.argv[1:] or ["4,16,4096,128", "16,16,1024,128"]
    for s in shapes:
        probe(*map(int, s.split(",")))


if __name__ == "__main__":
    main()
