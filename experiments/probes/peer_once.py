#!/usr/bin/env python3
"""One call of a peer at a shape, for Nsight Compute to profile beside our kernel at the same shape
(scripts/device_run.sh fa3 profile, fa3-bwd profile): the FA3-class kernel (FlashAttention-4's sm90 path, `fa4`)
or torch SDPA's cuDNN backend (`cudnn`), forward or forward + backward.

usage: peer_once.py fa4|cudnn fwd|bwd B,H,Sq,Sk,d CAUSAL(0|1)
       (bf16, inputs seeded N(0, 1); two calls: the first compiles; the profiler's kernel filter picks the call)
"""
import sys

import torch


def main():
    usage = __doc__.strip().splitlines()[-2].strip()
    if len(sys.argv) != 5:
        sys.exit(usage)
    try:
        who, direction = sys.argv[1], sys.argv[2]
        b, h, sq, sk, d = (int(x) for x in sys.argv[3].split(","))
        causal = {"0": False, "1": True}[sys.argv[4]]
        if who not in ("fa4", "cudnn") or direction not in ("fwd", "bwd"):
            raise ValueError
    except (ValueError, KeyError):
        sys.exit("peer_once: " + usage)
    g = torch.Generator(device="cuda").manual_seed(20261127)
    if who == "fa4":  # [B, S, H, d]
        from flash_attn.cute import flash_attn_func

        shapes = [(b, s, h, d) for s in (sq, sk, sk)]

        def call(q, k, v):
            o = flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
    else:  # [B, H, S, d]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        shapes = [(b, h, s, d) for s in (sq, sk, sk)]

        def call(q, k, v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = direction == "bwd"
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad) for s in shapes)
    dout = torch.randn(shapes[0], device="cuda", dtype=torch.bfloat16, generator=g)
    for _ in range(2):
        if grad:
            torch.autograd.grad(call(q, k, v), (q, k, v), dout)
        else:
            with torch.no_grad():
                call(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
