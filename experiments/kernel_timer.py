"""The timer every peer comparison uses: GPU kernel time of one call, read from torch.profiler.

kernel_ms: the median over `reps` calls of the summed durations of the kernels (and memsets/memcpys) one call
launches; L2 flushed (the caller's `flush`, a 256 MiB write) and synchronised before each call, outside the
profiled window; `warmup` calls first (FA4 JIT-compiles per shape). kernel_breakdown: one call's kernels by
name, for the *_kernels.csv files that say where each implementation's time goes.
"""
import statistics

import torch


def l2_flush():
    """A function that evicts L2 (a 256 MiB write; the H100's and H200's L2 is 50 MiB)."""
    buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    return buf.zero_


def kernel_ms(call, flush, reps, warmup=3):
    """Median over reps of the summed CUDA kernel (and memset/memcpy) durations of one call."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    act = [torch.profiler.ProfilerActivity.CUDA]
    times = []
    for _ in range(reps):
        flush()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=act) as prof:
            call()
            torch.cuda.synchronize()
        us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        if us <= 0:
            raise RuntimeError("the profiler saw no kernel")
        times.append(us / 1000.0)
    return statistics.median(times), times


def kernel_breakdown(call, flush):
    """One call's kernels, name -> microseconds (summed over launches of one name), longest first."""
    flush()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.time_range.elapsed_us()
    return sorted(per.items(), key=lambda kv: -kv[1])


def fa3_class_forward():
    """FlashAttention-4's flash_attn_func (its sm90 path is FlashAttention-3's design), or None with a note on
    stderr where it is not installed ([B, S, H, d] tensors; returns the output or a tuple led by it)."""
    import sys
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception as e:  # noqa: BLE001 - any import failure means: no FA3-class peer here
        print(f"note: FA3-class peer (flash_attn.cute) not installed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
