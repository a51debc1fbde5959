#!/usr/bin/env python3
"""Where a document mask's time goes (issue 32): each call's kernels (name, us) under the profiler, L2 flushed, for
the plain causal call and for mask_mod="doc[q_idx] == doc[kv_idx]" (causal) over one document (the mask adds
nothing: the mask path's own cost), four equal documents, and variants_peers.py's seeded documents; forward and
backward; d 128, S 4k and 16k, B = 16384 / S, H 16, bf16. Prints one line per call and its kernels."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_timer import kernel_breakdown, kernel_ms, l2_flush  # noqa: E402
from variants_peers import documents  # noqa: E402

import torch  # noqa: E402
from flashtune import torch as ftt  # noqa: E402


def main():
    flush = l2_flush()
    pred = "doc[q_idx] == doc[kv_idx]"
    for S in (4096, 16384):
        B, H, d = 16384 // S, 16, 128
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        seeded, lengths = documents(S)
        cases = {"dense": None, "one_doc": torch.zeros(S, dtype=torch.int32, device="cuda"),
                 "four_docs": (torch.arange(S, device="cuda") // (S // 4)).to(torch.int32), "seeded": seeded}
        for name, doc in cases.items():
            kw = {} if doc is None else {"mask_mod": pred, "mask_tensors": {"doc": doc}}
            for direction in ("fwd", "bwd"):
                if direction == "fwd":
                    def call():
                        with torch.no_grad():
                            return ftt.attention(q, k, v, causal=True, **kw)
                else:
                    o = ftt.attention(q, k, v, causal=True, **kw)

                    def call(o=o):
                        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                ms, _ = kernel_ms(call, flush, 7)
                parts = kernel_breakdown(call, flush)
                print(f"S {S} {name} {direction}: {ms:.4f} ms" + (f" (docs {lengths})" if name == "seeded" else ""),
                      flush=True)
                for kname, us in parts:
                    print(f"    {us:9.1f} us  {kname[:110]}")


if __name__ == "__main__":
    main()
