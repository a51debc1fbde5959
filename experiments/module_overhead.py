#!/usr/bin/env python3
"""What the PyTorch module costs over its kernels: forward + backward through flashtune.torch.attention
on the 18-point bf16 standard grid (16384 tokens, hidden 2048, S in {1k, 4k, 16k}, d in {64, 128, 256},
causal and not), beside the same kernels timed by the harness in the same run and torch SDPA (flash and
cuDNN backends) through PyTorch.

- module: o = attention(q, k, v, causal); torch.autograd.grad(o, (q, k, v), dout), everything the
  module does (checks, allocation, ctypes, the autograd engine) inside CUDA events; a warm-up (which
  also JIT-compiles), an L2 flush before every timed repeat, median of the repeats.
- kernel: the forward and backward family and config that explain() reports, each timed by
  `flashtune run --family F --params CFG --shape B,H,S,S,d --dtype bf16 [--causal] [--direction bwd] --json`
  (the worker's warm-up, L2 flush and median); their ms_median summed.
- sdpa_flash, sdpa_cudnn: the same fwd+bwd call as the module's, through F.scaled_dot_product_attention
  with one backend forced.
TFLOP/s as FlashAttention counts: forward 4*B*H*S^2*d (halved when causal), backward 2.5x, fwd+bwd 3.5x.
ratio = module_tflops / kernel_tflops (1.0: the module adds nothing), each module call timed after a
synchronisation (its host time exposed); module_steady_tflops / ratio_steady: eight calls back to back per
timing, as a training loop issues them; module_host_ms: the host time to issue one forward + backward.

usage: python3 experiments/module_overhead.py [--flashtune build/flashtune] [--reps 20] [--out CSV]
Writes reports/<gpu-slug>/module_overhead.csv by default.
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:  # the pip-installed package, else the source tree's with the library of build/ (or $FLASHTUNE_LIBRARY)
    import flashtune  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("FLASHTUNE_LIBRARY", os.path.join(ROOT, "build", "runtime", "libflashtune_attention.so"))
from flashtune.torch import attention, explain  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa_baseline import time_cuda  # noqa: E402  (warm-up, an L2 flush before each repeat, events)

TOKENS, HIDDEN = 16384, 2048
SEQS, HEAD_DIMS = (1024, 4096, 16384), (64, 128, 256)


def gpu_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def fwd_bwd_flops(B, H, S, d, causal):
    f = 4.0 * B * H * S * S * d
    return 3.5 * (f / 2 if causal else f)


def time_steady(fn, reps, iters, flush):
    """Back to back, as a training step issues them: `iters` calls between two events (one L2 flush
    before them), per call; median over `reps`. Host time of one call hides behind the previous call's
    kernels here, where time_cuda (a synchronisation before every call) exposes it."""
    times = []
    for i in range(reps):
        flush.fill_(float(i))
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / iters)
    return float(torch.tensor(times, dtype=torch.float64).quantile(0.5))  # the one median (core/timing.hpp)


def host_ms(fn, reps):
    """Host time to issue one call (after a synchronisation, so that nothing waits for the GPU)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return float(torch.tensor(times, dtype=torch.float64).quantile(0.5))  # the one median (core/timing.hpp)


def harness_ms(flashtune_bin, family, config, shape, causal, direction, timeout):
    cmd = [flashtune_bin, "run", "--family", family, "--params", config, "--shape", ",".join(map(str, shape)),
           "--dtype", "bf16", "--direction", direction, "--json", "--timeout", str(timeout)]
    if causal:
        cmd.append("--causal")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 600)
    try:
        j = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-300:]}") from None
    if j.get("status") != "ok":
        raise RuntimeError(f"{family} {config} {direction}: {j.get('status')}: {j.get('error')}")
    return float(j["ms_median"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashtune", default=os.path.join(ROOT, "build", "flashtune"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per harness run")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--out")
    a = ap.parse_args()
    device = torch.cuda.get_device_name()
    out = a.out or os.path.join(ROOT, "reports", gpu_slug(device), "module_overhead.csv")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda", dtype=torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    f = open(out, "w", newline="")  # written row by row: a run stopped early keeps what it measured
    w = csv.writer(f)
    w.writerow(["head_dim", "causal", "seq", "module_tflops", "kernel_tflops", "ratio", "sdpa_flash_tflops",
                "sdpa_cudnn_tflops", "module_steady_tflops", "ratio_steady", "module_host_ms"])
    for d in HEAD_DIMS:
        for causal in (False, True):
            for S in SEQS:
                B, H = TOKENS // S, HIDDEN // d
                q, k, v, dout = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                                 for _ in range(4))
                for t in (q, k, v):
                    t.requires_grad_(True)
                flops = fwd_bwd_flops(B, H, S, d, causal)
                tf = lambda ms: flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else 0.0  # noqa: E731

                def module():
                    o = attention(q, k, v, causal=causal)
                    torch.autograd.grad(o, (q, k, v), dout)

                def sdpa():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch.autograd.grad(o, (q, k, v), dout)

                module_ms = time_cuda(module, a.reps, a.warmup, flush)[0]
                steady_ms = time_steady(module, max(3, a.reps // 4), 8, flush)
                issue_ms = host_ms(module, a.reps)
                e = explain(q, k, v, causal=causal)
                kernel_ms, note = 0.0, ""
                try:
                    kernel_ms = sum(harness_ms(a.flashtune, x["family"], x["config"], (B, H, S, S, d), causal,
                                               direction, a.timeout)
                                    for x, direction in ((e, "fwd"), (e["backward"], "bwd")))
                except (RuntimeError, KeyError, subprocess.TimeoutExpired) as err:
                    note = f" harness: {err}"
                sdpa_tf = {}
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel([backend]):
                            sdpa_tf[name] = tf(time_cuda(sdpa, a.reps, a.warmup, flush)[0])
                    except RuntimeError as err:  # a backend that refuses a shape is a result (0), not a crash
                        sdpa_tf[name] = 0.0
                        note += f" sdpa {name}: {str(err).splitlines()[0][:120]}"
                module_tf, kernel_tf = tf(module_ms), tf(kernel_ms)
                ratio = module_tf / kernel_tf if kernel_tf else 0.0
                steady_tf = tf(steady_ms)
                w.writerow([d, int(causal), S, f"{module_tf:.2f}", f"{kernel_tf:.2f}", f"{ratio:.4f}",
                            f"{sdpa_tf['flash']:.2f}", f"{sdpa_tf['cudnn']:.2f}", f"{steady_tf:.2f}",
                            f"{steady_tf / kernel_tf if kernel_tf else 0.0:.4f}", f"{issue_ms:.3f}"])
                f.flush()
                print(f"d{d:<3} {'causal' if causal else 'full  '} S{S:<5} module {module_ms:8.3f} ms {module_tf:6.1f} "
                      f"TFLOP/s | kernels {kernel_ms:8.3f} ms {kernel_tf:6.1f} | ratio {ratio:.3f} | steady {steady_tf:6.1f} "
                      f"host {issue_ms:.3f} ms | sdpa flash "
                      f"{sdpa_tf['flash']:6.1f} cudnn {sdpa_tf['cudnn']:6.1f} | fwd {e['family']} {e['config']}, bwd "
                      f"{e['backward'].get('family', '?')} {e['backward'].get('config', '')}{note}", flush=True)
                del q, k, v, dout
                torch.cuda.empty_cache()
    f.close()
    print(f"wrote {out} ({device})")


if __name__ == "__main__":
    main()
