#!/usr/bin/env python3
"""Packed variable-length batches on one GPU in one run: per point of the problem sets (forward and backward
files alike), our tuned pick re-timed (`flashtune run --best`: the stored best config of the point's own row,
validated against the float64 reference, then the worker's CUDA events, warm-up, L2 flush, median), torch's
flash varlen path (aten::_flash_attention_forward / _flash_attention_backward with cum_seq_q, cum_seq_k,
max_q, max_k: what torch.nn.attention.varlen.varlen_attn calls) and torch's cuDNN on the same packed batch
(aten::_cudnn_attention_forward / _backward with the same offsets, else SDPA on jagged nested tensors with
the cuDNN backend forced), the forward or the backward alone, timed as experiments/sdpa_baseline.py times
(warm-up, an L2 flush before each repeat, CUDA events around the call alone, median), and once more with
the call's host work hidden: a GPU sleep longer than one call's host time is queued before the start event,
so the events bracket the kernels alone (torch_*_ms; the plain figure is torch_*_call_ms). The first H100
run showed why: torch 2.11's cuDNN varlen path builds its cuDNN graph on every call (50-97 ms a call against
~1 ms of kernels), so the call figure measures graph building. TFLOP/s and ratios use the kernel-only
figure, the stricter comparison for us (our own figure is the worker's events around our launches). A
backend that refuses the shape or runs out of memory gets an empty cell and the reason in torch_notes.

The lengths come from `flashtune problems FILE --json` (the seeded description expanded by flashtune itself),
so every implementation runs the same sequences; FLOPs are flashtune's (FlashAttention's convention per
sequence: 4 H Lq Lk d, halved when causal, 2.5x for the backward), the same count for every column, so a
ratio of TFLOP/s is a ratio of times. Bottom-right causal (ours, FlashAttention's since 2.1) and cuDNN's
top-left agree on these problems: self-attention, Lq == Lk per sequence.

usage: varlen_vs_peers.py --db reports/<gpu>/results.db --problems configs/problems/varlen_bf16.json \\
                          [--problems configs/problems/varlen_bwd_bf16.json] --out reports/<gpu>/varlen_vs_peers.csv
                          [--flashtune build/flashtune] [--reps 30] [--time-limit-s S]
Rows are written as each point finishes: a run stopped by a time limit keeps what it measured. The module
imports without torch (tests/test_varlen_peers_py.py checks its non-GPU logic).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

# Our families per direction: each one's stored pick is re-timed, the fastest valid one is the tuned figure
# (fa3_wgmma and fa2_wgmma_bwd have rows on Hopper only; elsewhere their runs fail and fa2_mma's, fa2_mma_bwd's
# stand). The last one is the default of run_argv.
FAMILIES = {"fwd": ("fa3_wgmma", "fa2_mma"), "bwd": ("fa2_wgmma_bwd", "fa2_mma_bwd")}
COLUMNS = ["direction", "heads_q", "heads_k", "causal", "lengths", "tuned_config", "tuned_tflops",
           "torch_flash_tflops", "torch_cudnn_tflops", "ratio_vs_flash", "ratio_vs_cudnn",
           # what the figures above come from
           "device", "sequences", "total_tokens", "max_len", "head_dim", "dtype", "tuned_family", "tuned_status",
           "tuned_ms", "torch_flash_ms", "torch_cudnn_ms", "torch_flash_call_ms", "torch_cudnn_call_ms",
           "torch_cudnn_path", "tuned_max_abs", "torch_notes"]


def load_points(flashtune, files):
    """The problems of each file as flashtune reads them (`flashtune problems --json`): with flops and, for
    packed batches, seq_lens_* and cu_seqlens_*. Dense problems are left out (this compares packed batches)."""
    points = []
    for path in files:
        r = subprocess.run([flashtune, "problems", path, "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"flashtune problems {path}: {(r.stderr or r.stdout).strip()[:300]}")
        points += [p for p in json.loads(r.stdout) if "varlen" in p]
    return points


def run_argv(flashtune, p, db, family=None):
    """`flashtune run` for the point's stored best (its own row: varlen problems have no bucket fallback)."""
    argv = [flashtune, "run", "--family", family or FAMILIES[p["direction"]][-1], "--best", "--db", db,
            "--shape", f"{p['heads']},{p['head_dim']}", "--varlen", json.dumps(p["varlen"], separators=(",", ":")),
            "--dtype", p["dtype"], "--direction", p["direction"], "--json"]
    if p["causal"]:
        argv.append("--causal")
    if "heads_k" in p:
        argv += ["--heads-k", str(p["heads_k"])]
    return argv


def flashtune_run(argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "error": (r.stderr or r.stdout).strip()[:200], "tflops": 0.0, "config": ""}


def best_run(runs):
    """The fastest valid run of our families' (each a dict with "family"), else the first: what the row reports."""
    ok = [r for r in runs if r.get("status") == "ok"]
    return max(ok, key=lambda r: r.get("tflops", 0.0)) if ok else runs[0]


def lengths_label(varlen):
    """A short name for the length description: "uniform 256-4096 x16384 seed 0", "[1,17,128]"."""
    if varlen.get("lengths") == "uniform":
        return f"uniform {varlen['min']}-{varlen['max']} x{varlen['total_tokens']} seed {varlen.get('seed', 0)}"
    if varlen.get("lengths") == "fixed":
        return f"fixed {varlen['length']} x{varlen['total_tokens']}"
    q = varlen.get("seq_lens", [])
    return "[" + ",".join(map(str, q)) + "]" if len(q) <= 8 else f"[{len(q)} seqs]"


def tflops(p, ms):
    return p["flops"] / (ms * 1e-3) / 1e12 if ms and ms > 0 else 0.0


def make_row(p, tuned, torch_ms, cudnn_path, notes, device, call_ms=None):
    """One CSV row: our tuned figure, each torch backend's (torch_ms: kernels only; call_ms: the whole call),
    the ratios (empty where a side has no figure)."""
    call_ms = call_ms or {}
    ok = tuned.get("status") == "ok"
    t = tuned.get("tflops", 0.0) if ok else 0.0
    base = {b: tflops(p, torch_ms.get(b, 0.0)) for b in ("flash", "cudnn")}
    fmt = lambda x: f"{x:.1f}" if x > 0 else ""
    ratio = lambda x, y: f"{x / y:.3f}" if x > 0 and y > 0 else ""
    lq = p["seq_lens_q"]
    return dict(direction=p["direction"], heads_q=p["heads"], heads_k=p.get("heads_k", p["heads"]), causal=int(p["causal"]),
                lengths=lengths_label(p["varlen"]), tuned_config=tuned.get("config", ""), tuned_tflops=fmt(t),
                torch_flash_tflops=fmt(base["flash"]), torch_cudnn_tflops=fmt(base["cudnn"]),
                ratio_vs_flash=ratio(t, base["flash"]), ratio_vs_cudnn=ratio(t, base["cudnn"]),
                device=device, sequences=len(lq), total_tokens=sum(lq), max_len=max(lq), head_dim=p["head_dim"],
                dtype=p["dtype"], tuned_family=tuned.get("family", FAMILIES[p["direction"]][-1]),
                tuned_status=tuned.get("status", "") + ("" if ok else ": " + str(tuned.get("error", ""))[:120]),
                tuned_ms=f"{tuned.get('ms_median', 0.0):.4f}" if ok else "",
                torch_flash_ms=f"{torch_ms['flash']:.4f}" if torch_ms.get("flash") else "",
                torch_cudnn_ms=f"{torch_ms['cudnn']:.4f}" if torch_ms.get("cudnn") else "",
                torch_flash_call_ms=f"{call_ms['flash']:.4f}" if call_ms.get("flash") else "",
                torch_cudnn_call_ms=f"{call_ms['cudnn']:.4f}" if call_ms.get("cudnn") else "",
                torch_cudnn_path=cudnn_path, tuned_max_abs=tuned.get("max_abs", ""), torch_notes="; ".join(notes))


# ---- torch (imported only here: the functions above run without it) ----------------------------------

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def packed_inputs(p, seed):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, DTYPES[p["dtype"]])
    tq, tk = p["cu_seqlens_q"][-1], p["cu_seqlens_k"][-1]
    hq, hk, d = p["heads"], p.get("heads_k", p["heads"]), p["head_dim"]
    q = torch.randn((tq, hq, d), device="cuda", dtype=dt, generator=gen)
    k = torch.randn((tk, hk, d), device="cuda", dtype=dt, generator=gen)
    v = torch.randn((tk, hk, d), device="cuda", dtype=dt, generator=gen)
    cu_q = torch.tensor(p["cu_seqlens_q"], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor(p["cu_seqlens_k"], device="cuda", dtype=torch.int32)
    return q, k, v, cu_q, cu_k, max(p["seq_lens_q"]), max(p["seq_lens_k"])


def flash_call(p, q, k, v, cu_q, cu_k, max_q, max_k):
    """The callable timed for torch's flash varlen path: the forward, or the backward of one forward."""
    import torch
    causal = bool(p["causal"])
    fwd = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False)
    if p["direction"] == "fwd":
        return fwd
    out, lse, rng, unused, _ = fwd()
    dout = torch.randn_like(out)
    return lambda: torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0,
                                                           causal, rng, unused)


def cudnn_call(p, q, k, v, cu_q, cu_k, max_q, max_k):
    """torch's cuDNN on the packed batch: (callable, path). The aten op with ragged offsets first, else SDPA on
    jagged nested tensors with the cuDNN backend forced; each raises when it refuses the shape."""
    import torch
    causal = bool(p["causal"])
    errors = []
    op = getattr(torch.ops.aten, "_cudnn_attention_forward", None)
    if op is not None:
        try:
            # (q, k, v, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, compute_log_sumexp, dropout_p, is_causal,
            # return_debug_mask) -> (out, lse, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, mask).
            # The LSE is computed, as ours and flash's forwards write it (a training forward's outputs).
            fwd = lambda: op(q, k, v, None, cu_q, cu_k, max_q, max_k, True, 0.0, causal, False)
            res = fwd()
            torch.cuda.synchronize()
            if p["direction"] == "fwd":
                return fwd, "aten._cudnn_attention_forward"
            out, lse, seed, offset = res[0], res[1], res[6], res[7]
            dout = torch.randn_like(out)
            # (grad_out, q, k, v, out, lse, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
            # dropout_p, is_causal): the schema of _scaled_dot_product_cudnn_attention_backward.
            bwd = lambda: torch.ops.aten._cudnn_attention_backward(dout, q, k, v, out, lse, seed, offset, None, cu_q, cu_k,
                                                                  max_q, max_k, 0.0, causal)
            bwd()
            torch.cuda.synchronize()
            return bwd, "aten._cudnn_attention_backward"
        except Exception as e:  # refused: the nested-tensor route below
            errors.append(f"aten op: {type(e).__name__}: {first_line(e)}")
    try:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        nested = lambda x, cu: torch.nested.nested_tensor_from_jagged(x, offsets=cu.long()).transpose(1, 2)
        qn, kn, vn = nested(q, cu_q), nested(k, cu_k), nested(v, cu_k)
        gqa = {"enable_gqa": True} if p.get("heads_k", p["heads"]) != p["heads"] else {}
        if p["direction"] == "bwd":
            for t in (qn, kn, vn):
                t.requires_grad_(True)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal, **gqa)
        if p["direction"] == "fwd":
            def run():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal, **gqa)
            return run, "sdpa(nested jagged, cudnn)"
        dout = torch.randn_like(out)
        return (lambda: torch.autograd.grad(out, (qn, kn, vn), dout, retain_graph=True)), "sdpa(nested jagged, cudnn)"
    except Exception as e:
        errors.append(f"nested sdpa: {type(e).__name__}: {first_line(e)}")
    raise RuntimeError("; ".join(errors))


def sleep_cycles(host_s, clock_hz=2.0e9, margin=1.5, floor=1_000_000):
    """GPU cycles to sleep so that the GPU is still busy when the host has queued the call's kernels."""
    return int(host_s * clock_hz * margin) + floor


def time_kernels_only(run, reps, warmup=3):
    """Median ms of `run` with its host work hidden: per repeat an L2 flush, a GPU sleep longer than one
    call's host time (measured after the warm-up), then CUDA events around the call: the events see the
    kernels alone. None when torch has no GPU sleep."""
    import torch
    import sdpa_baseline  # main() put this directory on the path
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    host = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    cycles = sleep_cycles(max(host))
    return sdpa_baseline.time_cuda(run, reps, warmup=0, before_each=lambda: sleep(cycles))[0]


def first_line(e):
    s = str(e)
    return s.splitlines()[0][:120] if s else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--problems", action="append", required=True, help="a problem file (repeat for fwd and bwd files)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--flashtune", default="build/flashtune")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--time-limit-s", type=float, default=0, help="start no point after this many seconds (0: none)")
    a = ap.parse_args()
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sdpa_baseline  # noqa: E402  (time_cuda: warm-up, L2 flush, events, median)

    points = load_points(a.flashtune, a.problems)
    device = torch.cuda.get_device_name(0)
    start = time.monotonic()
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for p in points:
            if a.time_limit_s and time.monotonic() - start > a.time_limit_s:
                print(f"time limit: {len(points)} points, stopped before {p['direction']} {lengths_label(p['varlen'])}",
                      file=sys.stderr)
                break
            tuned = best_run([dict(flashtune_run(run_argv(a.flashtune, p, a.db, fam)), family=fam)  # before torch holds memory
                              for fam in FAMILIES[p["direction"]]])
            torch_ms, call_ms, notes, cudnn_path = {}, {}, [], ""
            for backend in ("flash", "cudnn"):
                try:
                    args = packed_inputs(p, a.seed)
                    if backend == "flash":
                        call = flash_call(p, *args)
                    else:
                        call, cudnn_path = cudnn_call(p, *args)
                    call_ms[backend] = sdpa_baseline.time_cuda(call, a.reps)[0]
                    kernels = time_kernels_only(call, a.reps)
                    if kernels is None:
                        notes.append(f"{backend}: no torch.cuda._sleep, the call's time stands for its kernels'")
                    torch_ms[backend] = kernels if kernels is not None else call_ms[backend]
                except Exception as e:  # refused shape, missing op, out of memory: a result, not a crash
                    notes.append(f"{backend}: {type(e).__name__}: {first_line(e)}")
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            row = make_row(p, tuned, torch_ms, cudnn_path, notes, device, call_ms)
            w.writerow(row)
            fh.flush()
            print(" ".join(f"{k}={row[k]}" for k in COLUMNS[:11]), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
