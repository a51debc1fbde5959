#!/usr/bin/env python3
"""Decoding through the op as a serving loop calls it (issue 31): flashtune.torch.attention against torch SDPA's
backends, call by call, on the grouped-query decoding grid (Hq 32, Hk 8, d 128, Sq 1, bf16; B in {1, 8, 64} x
Sk in {4k, 32k, 128k}), all in one process.

Timer, the same for every implementation: CUDA events around one call (its host work and its kernels, as a
decoding step pays them), the L2 flushed and the stream synchronised before each call outside the events,
warm-up calls first, the median of --reps calls taken in 4 rounds that visit flashtune and the fused torch backends
in a rotated order (math, which materialises the scores, alone after them). Inputs seeded N(0, 1), [B, H, S, d], no autograd graph.
GB/s count the compulsory bytes: Q, K, V read and O written once. Each output is compared with the first torch
backend that runs (max |ours - torch|, a column) before anything is timed. A backend that refuses the shape or
runs out of memory (enable_gqa can expand K and V) is recorded in torch_notes, not fatal.

usage: decode_op_peers.py --out reports/<gpu>/decode_op_vs_peers.csv [--reps 20] [--batches 1,8,64]
       [--seq-k 4096,32768,131072]   (FLASHTUNE_LIBRARY and PYTHONPATH=python if the package is not installed)
Rows are written as each point finishes.
"""
import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
COLUMNS = ["batch", "seq_k", "flashtune_gbps", "best_torch_backend", "best_torch_gbps", "ratio",
           # what the figures above come from
           "device", "heads_q", "heads_k", "head_dim", "dtype", "flashtune_us", "flashtune_config", "max_abs_vs_torch"] + \
          [f"torch_{b}_gbps" for b in BACKENDS] + ["torch_notes"]


def int_list(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > 1 << 20:
        raise argparse.ArgumentTypeError(f"values must be in 1..2^20, got {text!r}")
    return values


def call_times(call, flush, reps):
    """Microseconds of each of reps calls between CUDA events on the current stream (L2 flushed before each)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        flush()
        torch.cuda.synchronize()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def interleaved_us(calls, flush, reps, rounds=4, warmup=3):
    """Median microseconds per call of each of calls ({name: callable}), timed in rounds that take the
    implementations in a rotated order (reps / rounds calls each a round): a drift of the GPU's clocks or power over
    the run then hits every implementation alike, where one timed after another saw its own state (measured: a
    first-timed cuDNN 10-20% faster by call than a last-timed flashtune whose kernels the profiler put at parity)."""
    names = list(calls)
    for n in names:
        for _ in range(warmup):
            calls[n]()
    times = {n: [] for n in names}
    per = max(1, -(-reps // rounds))
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n] += call_times(calls[n], flush, per)
    return {n: statistics.median(t) for n, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20, choices=range(3, 1001), metavar="3..1000")
    ap.add_argument("--batches", type=int_list, default=[1, 8, 64])
    ap.add_argument("--seq-k", type=int_list, default=[4096, 32768, 131072])
    ap.add_argument("--seed", type=int, default=20261128)
    a = ap.parse_args()
    import flashtune.torch as ftt

    H, Hk, d, dt = 32, 8, 128, torch.bfloat16
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # larger than any L2 of today

    def flush():
        scratch.zero_()

    device = torch.cuda.get_device_name(0)
    out = open(a.out, "w", newline="")
    w = csv.DictWriter(out, fieldnames=COLUMNS)
    w.writeheader()
    for B in a.batches:
        for Sk in a.seq_k:
            g = torch.Generator(device="cuda").manual_seed(a.seed)
            q = torch.randn(B, H, 1, d, device="cuda", dtype=dt, generator=g)
            k = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)
            v = torch.randn(B, Hk, Sk, d, device="cuda", dtype=dt, generator=g)
            nbytes = 2 * (q.numel() * 2 + k.numel() + v.numel())  # Q read, O written, K and V read: bf16
            row = {"batch": B, "seq_k": Sk, "device": device, "heads_q": H, "heads_k": Hk, "head_dim": d,
                   "dtype": "bf16"}
            notes = []
            with torch.no_grad():
                ours = lambda: ftt.attention(q, k, v)  # noqa: E731
                got = ours()
                info = ftt.explain(q, k, v)
                row["flashtune_config"] = f"{info.get('family', '')} {info.get('config', info.get('error', ''))}"
                calls, alone = {"flashtune": ours}, {}  # alone: math, which materialises the scores (never the best)
                for name, backend in BACKENDS.items():
                    row[f"torch_{name}_gbps"] = ""
                    def sdpa(backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    try:  # a backend that refuses the shape or runs out of memory is a note, not timed
                        ref = sdpa()
                        if "max_abs_vs_torch" not in row:
                            row["max_abs_vs_torch"] = f"{(got.float() - ref.float()).abs().max().item():.3g}"
                        del ref
                        (alone if name == "math" else calls)[name] = sdpa
                    except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a result
                        notes.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    torch.cuda.empty_cache()
                med = interleaved_us(calls, flush, a.reps)
                for name, call in alone.items():
                    try:
                        med[name] = interleaved_us({name: call}, flush, a.reps)[name]
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    torch.cuda.empty_cache()
                gbps = {n: nbytes / (t * 1e-6) / 1e9 for n, t in med.items() if n != "flashtune"}
                for n, g_ in gbps.items():
                    row[f"torch_{n}_gbps"] = f"{g_:.1f}"
                us = med["flashtune"]
            row["flashtune_us"] = f"{us:.1f}"
            ours_gbps = nbytes / (us * 1e-6) / 1e9
            row["flashtune_gbps"] = f"{ours_gbps:.1f}"
            if gbps:
                best = max(gbps, key=gbps.get)
                row["best_torch_backend"], row["best_torch_gbps"] = best, f"{gbps[best]:.1f}"
                row["ratio"] = f"{ours_gbps / gbps[best]:.3f}"
            row["torch_notes"] = "; ".join(notes)
            w.writerow(row)
            out.flush()
            print(f"B {B} Sk {Sk}: flashtune {row['flashtune_gbps']} GB/s ({row['flashtune_config']}), best torch "
                  f"{row.get('best_torch_backend', '')} {row.get('best_torch_gbps', '')}, ratio {row.get('ratio', '')}",
                  file=sys.stderr)
            del q, k, v, got
            torch.cuda.empty_cache()
    out.close()


if __name__ == "__main__":
    main()
