#!/usr/bin/env python3
"""How close torch SDPA's flash and cuDNN backends get to a float64 reference on flashtune's kind of
inputs (normal, rounded to the dtype), and whether they pass flashtune's tolerance rule
|out - ref| <= atol + rtol*|ref| (worker/validate.hpp). The tolerances are justified when torch's own
kernels pass them with margin and the worst error sits well inside.

usage: tolerance_probe.py --out probe.csv
"""
import argparse
import csv

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOL = {"bf16": (1e-2, 2e-2), "fp16": (2e-3, 1e-2)}  # keep in step with worker/validate.hpp
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for dtype in ("bf16", "fp16"):
        atol, rtol = TOL[dtype]
        for d in (64, 128, 256):
            for causal in (False, True):
                for S in (1024, 4096):
                    B, H = 1, 4
                    q, k, v = (torch.randn(B, H, S, d, device="cuda", generator=g).to(DT[dtype]) for _ in range(3))
                    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
                    for backend, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        with sdpa_kernel([be]):
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal).double()
                        err = (out - ref).abs()
                        bound = atol + rtol * ref.abs()
                        rows.append(dict(dtype=dtype, head_dim=d, causal=int(causal), seq=S, impl=f"torch_{backend}",
                                         max_abs=f"{err.max().item():.3e}", mean_abs=f"{err.mean().item():.3e}",
                                         worst_err_over_bound=f"{(err / bound).max().item():.3f}",
                                         rel_l2=f"{(err.norm() / ref.norm()).item():.3e}",
                                         passes=int(bool((err <= bound).all()))))
                        print(rows[-1], flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
