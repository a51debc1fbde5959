#!/usr/bin/env python3
"""Attention variants beside their peers in one process, GPU kernel time (issue 32's variants_vs_peers.csv).

For each variant (a causal sliding window of 1024 or 4096 keys, softcap 30, ALiBi; all causal, as the decoder
models that use them), head dim, sequence length and direction: flashtune.torch.attention with the variant, the
same op without it (the plain causal call, same shape: "dense"), FlexAttention compiled with the same mask
(create_block_mask, so that it skips whole blocks too) and score_mod, and the FA3-class kernel (FlashAttention-4's
sm90 path) where it takes the variant (window_size, softcap; skipped with a note where it is not installed or
refuses). Shapes as the standard grid's: 16384 tokens (B = 16384 / S), hidden 2048 (H = 2048 / d), bf16, seeded
N(0, 1) inputs.

Timer (experiments/kernel_timer.py, the same for every implementation): the summed durations of the kernels one
call launches, read from torch.profiler, L2 flushed before each call, warm-up calls first (FlexAttention and FA4
compile per shape), the median of --reps calls. The backward is torch.autograd.grad of a stored forward output.
FLOPs count the visible (query, key) pairs only: 4 d per pair forward, 2.5 times that backward; tflops_effective
= those FLOPs / time. dense_tflops is the plain causal call's own rate (its own visible pairs), so
ratio_vs_dense = tflops_effective / dense_tflops says what the variant costs per visible pair (a window should cost
what its blocks cost: ~1.0). ratio_vs_flex and ratio_vs_fa4 are time ratios (the peer's time over ours).
max_abs_vs_flex: the largest difference between our output (forward; dq backward) and FlexAttention's on the same
inputs, so that the rows compare the same computation.

The document mask (docmask) is a mask_mod through the op (attention(..., mask_mod="doc[q_idx] == doc[kv_idx]",
mask_tensors={"doc": ...}), causal) over seeded documents of S / 16 to S / 4 tokens (documents()), FlexAttention's
the same predicate; FA3-class takes no predicate (its packed varlen call would be the same computation through
another API), so that column is blank there.

usage: variants_peers.py --out variants_vs_peers.csv [--reps 10] [--head-dims 64 128] [--seqs 4096 16384]
                         [--variants window1024 window4096 softcap30 alibi docmask] [--directions fwd bwd] [--warm]
Rows are appended to --out as they are measured (a time limit that stops the run keeps what it measured).
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_timer import fa3_class_forward, kernel_ms, l2_flush  # noqa: E402

import torch  # noqa: E402

VARIANTS = {  # name -> (window left or None, softcap, alibi, documents: a mask_mod)
    "window1024": (1024, 0.0, False, False),
    "window4096": (4096, 0.0, False, False),
    "softcap30": (None, 30.0, False, False),
    "alibi": (None, 0.0, True, False),
    "docmask": (None, 0.0, False, True),
}
DOC_MASK = "doc[q_idx] == doc[kv_idx]"  # with causal=True: causal attention within each packed document
FIELDS = ["device", "variant", "direction", "head_dim", "seq", "batch", "heads", "causal", "flashtune_ms",
          "tflops_effective", "dense_tflops", "flex_tflops", "fa4_tflops", "ratio_vs_dense", "ratio_vs_flex",
          "ratio_vs_fa4", "max_abs_vs_flex", "family"]


def visible_pairs(S, window):
    """Causal (query, key) pairs of an S x S problem, within `window` keys to the left when given."""
    if window is None or window >= S:
        return S * (S + 1) // 2
    return window * (window + 1) // 2 + (S - window) * (window + 1)  # rows i < W see i + 1; the rest W + 1


def documents(S, seed=0):
    """Seeded document lengths that pack S tokens, each between S / 16 and S / 4 (the last one takes the rest, at
    least 1): packed pretraining sequences of a few documents each. Returns the int32 [S] document index of each
    token (on the GPU) and the lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths, left = [], S
    while left > 0:
        n = int(torch.randint(S // 16, S // 4 + 1, (1,), generator=g))
        lengths.append(min(n, left))
        left -= lengths[-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
    return doc.to("cuda"), lengths


def alibi_slopes(H):
    """ALiBi's geometric slopes 2^(-8 (h + 1) / H) (BLOOM's for a power-of-two H)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float32, device="cuda")


MODS = {"window": None, "cap": 0.0, "slopes": None, "doc": None}  # the row's settings, read by the functions below


def causal_mask(b, h, qi, ki):
    return qi >= ki


def window_mask(b, h, qi, ki):
    return (qi >= ki) & (qi - ki <= MODS["window"])


def document_mask(b, h, qi, ki):
    return (qi >= ki) & (MODS["doc"][qi] == MODS["doc"][ki])


def softcap_mod(s, b, h, qi, ki):
    return MODS["cap"] * torch.tanh(s / MODS["cap"])


def alibi_mod(s, b, h, qi, ki):
    return s - MODS["slopes"][h] * (qi - ki)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--warm", action="store_true",
                    help="call every implementation of every row once and write nothing: the JIT caches (ours, "
                         "Inductor's) filled by processes run side by side before the timed run")
    a = ap.parse_args()

    from flashtune import torch as ftt
    # The timed backward replays one stored forward graph (retain_graph=True), which compiled backwards with
    # donated buffers refuse (the run of 2026-11-29 left FlexAttention's S 16k backward rows blank).
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    fa4 = fa3_class_forward()
    flush = l2_flush()
    device = torch.cuda.get_device_name()
    new = not os.path.exists(a.out)
    out = open(a.out, "a", newline="")
    w = csv.DictWriter(out, fieldnames=FIELDS)
    if new:
        w.writeheader()

    def timed(direction, fwd, inputs, do):
        """Kernel ms of the forward call, or of the backward (with output gradient `do`, the same for every
        implementation of a row) of one stored forward output; and that output (backward: dq). --warm: one
        untimed call."""
        if a.warm:
            with torch.no_grad() if direction == "fwd" else torch.enable_grad():
                r = fwd() if direction == "fwd" else torch.autograd.grad(fwd(), inputs, do)[0]
            torch.cuda.synchronize()
            return 1.0, r
        if direction == "fwd":
            with torch.no_grad():
                return kernel_ms(fwd, flush, a.reps)[0], fwd()
        o = fwd()
        call = lambda: torch.autograd.grad(o, inputs, do, retain_graph=True)  # noqa: E731
        return kernel_ms(call, flush, a.reps)[0], call()[0]

    for d in a.head_dims:
        for S in a.seqs:
            B, H = max(1, 16384 // S), max(1, 2048 // d)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
                       for _ in range(3))
            slopes = alibi_slopes(H)
            doc, doc_lengths = documents(S)
            do = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
            do_t = do.transpose(1, 2).contiguous()  # FA4's [B, S, H, d]
            for direction in a.directions:
                per_pair = 4 * d * (2.5 if direction == "bwd" else 1.0) * B * H
                dense_ms, _ = timed(direction, lambda: ftt.attention(q, k, v, causal=True), (q, k, v), do)
                dense_tflops = per_pair * visible_pairs(S, None) / dense_ms / 1e9
                for name in a.variants:
                    window, cap, alibi, docs = VARIANTS[name]
                    kw = {}
                    if window is not None:
                        kw["window_size"] = (window, 0)
                    if cap:
                        kw["softcap"] = cap
                    if alibi:
                        kw["alibi_slopes"] = slopes
                    if docs:
                        kw.update(mask_mod=DOC_MASK, mask_tensors={"doc": doc})
                    ours_ms, ours = timed(direction, lambda: ftt.attention(q, k, v, causal=True, **kw), (q, k, v), do)
                    pairs = sum(n * (n + 1) // 2 for n in doc_lengths) if docs else visible_pairs(S, window)
                    flops = per_pair * pairs
                    row = {"device": device, "variant": name, "direction": direction, "head_dim": d, "seq": S,
                           "batch": B, "heads": H, "causal": 1, "flashtune_ms": f"{ours_ms:.4f}",
                           "tflops_effective": f"{flops / ours_ms / 1e9:.1f}", "dense_tflops": f"{dense_tflops:.1f}",
                           "ratio_vs_dense": f"{flops / ours_ms / 1e9 / dense_tflops:.3f}"}
                    info = ftt.explain(q, k, v, causal=True, window_size=kw.get("window_size", (-1, -1)),
                                       softcap=cap, alibi_slopes=slopes if alibi else None)  # docmask: the same family
                    row["family"] = (info.get("backward", {}) if direction == "bwd" else info).get("family", "")
                    # Each row compiles FlexAttention afresh: the first run of this script reused the softcap row's
                    # compiled score_mod for the ALiBi row (one function, its settings in default arguments), which
                    # the max_abs_vs_flex column showed (4.24). Each variant's mask and score_mod are functions of
                    # their own, their settings in the module's globals.
                    torch._dynamo.reset()
                    flex = torch.compile(flex_attention, dynamic=False)
                    MODS.update(window=window, cap=cap, slopes=slopes, doc=doc)
                    try:
                        mask_fn = window_mask if window is not None else document_mask if docs else causal_mask
                        bm = create_block_mask(mask_fn, None, None, S, S, device="cuda")
                        sm = softcap_mod if cap else alibi_mod if alibi else None
                        flex_ms, theirs = timed(direction, lambda: flex(q, k, v, score_mod=sm, block_mask=bm),
                                                (q, k, v), do)
                        row["flex_tflops"] = f"{flops / flex_ms / 1e9:.1f}"
                        row["ratio_vs_flex"] = f"{flex_ms / ours_ms:.3f}"
                        row["max_abs_vs_flex"] = f"{(ours.float() - theirs.float()).abs().max().item():.3g}"
                    except Exception as e:  # noqa: BLE001 - a peer that cannot run the row leaves it blank
                        print(f"flex {name} d {d} S {S} {direction}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                    # FA3-class takes neither ALiBi nor a predicate; its compile cache is the process's own (not warmed)
                    if fa4 is not None and not alibi and not docs and not a.warm:
                        try:
                            qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))
                            fkw = {"causal": True}
                            if window is not None:
                                fkw["window_size"] = (window, 0)
                            if cap:
                                fkw["softcap"] = cap

                            def fa4_call(fkw=fkw, qt=qt, kt=kt, vt=vt):
                                r = fa4(qt, kt, vt, **fkw)
                                return r[0] if isinstance(r, tuple) else r

                            fa4_ms, _ = timed(direction, fa4_call, (qt, kt, vt), do_t)
                            row["fa4_tflops"] = f"{flops / fa4_ms / 1e9:.1f}"
                            row["ratio_vs_fa4"] = f"{fa4_ms / ours_ms:.3f}"
                        except Exception as e:  # noqa: BLE001
                            print(f"fa4 {name} d {d} S {S} {direction}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                    if a.warm:
                        continue
                    w.writerow(row)
                    out.flush()
                    print(" ".join(f"{k}={row.get(k, '')}" for k in ("variant", "direction", "head_dim", "seq",
                          "tflops_effective", "dense_tflops", "flex_tflops", "fa4_tflops", "ratio_vs_flex",
                          "max_abs_vs_flex")), flush=True)
    out.close()


if __name__ == "__main__":
    main()
