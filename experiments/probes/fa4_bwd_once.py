#!/usr/bin/env python3
"""One backward of the FA3-class kernel (FlashAttention-4's sm90 path) at a shape, for Nsight Compute to
profile beside fa3_wgmma_bwd at the same shape (scripts/device_run.sh fa3-bwd profile).

usage: fa4_bwd_once.py B,H,Sq,Sk,d CAUSAL(0|1)   (bf16, inputs seeded N(0, 1); two calls: the first JIT-compiles)
"""
import sys

import torch
from flash_attn.cute import flash_attn_func


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    try:
        b, h, sq, sk, d = (int(x) for x in sys.argv[1].split(","))
        causal = {"0": False, "1": True}[sys.argv[2]]
    except (ValueError, KeyError):
        sys.exit("fa4_bwd_once: expected B,H,Sq,Sk,d and 0|1")
    g = torch.Generator(device="cuda").manual_seed(20261127)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for s in (sq, sk, sk))
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    for _ in range(2):
        o = flash_attn_func(q, k, v, causal=causal)
        o = o[0] if isinstance(o, tuple) else o
        torch.autograd.grad(o, (q, k, v), dout)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
