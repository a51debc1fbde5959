#!/usr/bin/env python3
"""flashtune.torch on a GPU (label gpu), from the source tree: PYTHONPATH=<repo>/python and
FLASHTUNE_LIBRARY=<the built libflashtune_attention.so> (tests/CMakeLists.txt sets both).

- Forward and backward through the custom op against a float64 reference computed by torch (bottom-right
  causal, fully masked rows O = 0), on ragged, causal, Sq != Sk (both ways) and transposed ([B, S, H, d])
  shapes. fp32: relative L2 error <= 1e-5 for O, dQ, dK, dV. fp16/bf16: relative L2 no worse than 1.2x
  torch flash's (SDPA, flash backend) on the same inputs against the same reference, max-abs within 2x.
- A model using the op under torch.compile(fullgraph=True): forward and backward match eager.
- torch.autocast("cuda", bf16) on fp32 inputs runs in bf16, as SDPA does (eager and compiled).
- A side stream, the FlashAttention module, explain(), and the one-line errors (CPU tensors, mixed
  dtypes, wrong ranks, Hq != Hk, an unsupported head dim).
- Decoding through the dense op (Sq 1 and 16 against K/V caches, GQA): the same accuracy bar; where the
  committed tables (configs/generated) hold a decode_splitkv entry for this GPU, explain() must name it.
- attention_varlen (packed batches: ragged and empty sequences, cross-attention lengths, GQA and MQA, a q
  sliced out of a packed qkv projection, a loose max_seqlen): O, dQ, dK, dV against the float64 reference
  of each sequence alone, relative L2 no worse than 1.2x torch flash's run on each sequence, max-abs 2x;
  under torch.compile(fullgraph=True) the same as eager; explain_varlen(); its one-line errors.
"""
import glob
import math
import os
import re
import sys
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtune
from flashtune.torch import FlashAttention, attention, attention_varlen, explain, explain_varlen

FAILURES = []
SEED = 20261123


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


# --- references ------------------------------------------------------------------------------------
def causal_mask(sq, sk, device):
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq)  # bottom-right, as FlashAttention


def expand_kv(q, k, v):
    """Grouped-query attention as multi-head: each kv head repeated over its group (differentiable, so
    the gradients of the originals are the group sums). Returns (k, v)."""
    g = q.shape[1] // k.shape[1]
    return (k, v) if g == 1 else (k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))


def reference(q, k, v, dout, causal, scale):
    """float64 forward and backward (autograd in double precision); rows that see no key: O = 0."""
    q, k0, v0 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    k, v = expand_kv(q, k0, v0)
    s = (q @ k.transpose(-1, -2)) * scale
    sq, sk = q.shape[2], k.shape[2]
    mask = causal_mask(sq, sk, q.device) if causal else torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    seen = mask.any(-1, keepdim=True)
    s = torch.where(mask, s, float("-inf"))
    s = torch.where(seen, s, 0.0)
    p = torch.softmax(s, dim=-1) * seen
    o = p @ v
    dq, dk, dv = torch.autograd.grad(o, (q, k0, v0), dout.double())
    return o.detach(), dq, dk, dv


def torch_flash(q, k, v, dout, causal, scale):
    """torch SDPA, flash backend, bottom-right causal through square sub-problems: for Sq < Sk the queries
    are padded in front (zero dO there, so dK and dV are unchanged); for Sq > Sk the first Sq - Sk rows
    see no key (O = 0, dQ = 0) and the rest are a square causal problem. Grouped-query attention: the
    same products on K and V repeated over each group; the gradients are the originals'."""
    sq, sk = q.shape[2], k.shape[2]
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v))
    q = leaves[0]
    k, v = expand_kv(*leaves)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        if not causal or sq == sk:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            dq, dk, dv = torch.autograd.grad(o, leaves, dout)
            return o.detach(), dq, dk, dv
        if sq < sk:
            pad = torch.zeros(q.shape[0], q.shape[1], sk - sq, q.shape[3], dtype=q.dtype, device=q.device)
            qp = torch.cat([pad, q], dim=2)
            op = F.scaled_dot_product_attention(qp, k, v, is_causal=True, scale=scale)
            o = op[:, :, sk - sq:]
            dq, dk, dv = torch.autograd.grad(o, leaves, dout)
            return o.detach(), dq, dk, dv
        m = sq - sk
        o_tail = F.scaled_dot_product_attention(q[:, :, m:], k, v, is_causal=True, scale=scale)
        dq, dk, dv = torch.autograd.grad(o_tail, leaves, dout[:, :, m:])
        o = torch.cat([torch.zeros_like(q[:, :, :m]), o_tail], dim=2)
        return o.detach(), dq, dk, dv


def errors(x, ref):
    d = x.double() - ref
    return d.abs().max().item(), (d.norm() / ref.norm().clamp_min(1e-300)).item()


def make(shape, dtype, layout, gen):
    B, H, S, d = shape
    if layout == "bshd":  # PyTorch's transposed layout: [B, S, H, d] memory seen as [B, H, S, d]
        return torch.randn(B, S, H, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    return torch.randn(B, H, S, d, device="cuda", dtype=dtype, generator=gen)


# --- accuracy --------------------------------------------------------------------------------------
CASES = [  # B, H, Sq, Sk, d, causal, dtype, layout
    (2, 3, 113, 113, 64, False, torch.float32, "bhsd"),
    (1, 2, 77, 200, 64, True, torch.float32, "bhsd"),
    (2, 2, 200, 77, 128, True, torch.float32, "bshd"),
    (1, 3, 129, 257, 128, False, torch.float32, "bhsd"),
    (2, 3, 113, 113, 64, False, torch.bfloat16, "bhsd"),
    (2, 4, 255, 255, 64, True, torch.bfloat16, "bhsd"),
    (1, 2, 77, 200, 128, True, torch.bfloat16, "bhsd"),
    (1, 2, 200, 77, 128, True, torch.bfloat16, "bhsd"),
    (2, 2, 300, 300, 128, False, torch.bfloat16, "bshd"),
    (1, 2, 130, 190, 256, True, torch.bfloat16, "bhsd"),
    (1, 2, 257, 257, 256, False, torch.bfloat16, "bshd"),
    (2, 3, 113, 301, 64, True, torch.float16, "bhsd"),
    (1, 4, 320, 320, 128, True, torch.float16, "bshd"),
]
GQA_CASES = [  # B, H, Hk, Sq, Sk, d, causal, dtype, layout: grouped- and multi-query attention
    (2, 8, 2, 113, 301, 128, True, torch.bfloat16, "bhsd"),
    (1, 6, 1, 200, 77, 64, True, torch.float16, "bshd"),
    (2, 4, 2, 255, 255, 64, False, torch.bfloat16, "bshd"),
    # decoding: one token (causal: it sees every key) and 16 draft tokens against a K/V cache
    (2, 32, 8, 1, 4096, 128, True, torch.bfloat16, "bhsd"),
    (3, 16, 2, 16, 700, 128, False, torch.bfloat16, "bshd"),
]


def accuracy():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    cases = [(B, H, H, sq, sk, d, c, dt, lay) for B, H, sq, sk, d, c, dt, lay in CASES] + GQA_CASES
    for B, H, Hk, sq, sk, d, causal, dtype, layout in cases:
        name = (f"{str(dtype).split('.')[-1]} B{B} H{H}{f'/{Hk}' if Hk != H else ''} Sq{sq} Sk{sk} d{d}"
                f"{' causal' if causal else ''} {layout}")
        q = make((B, H, sq, d), dtype, layout, gen).requires_grad_(True)
        k = make((B, Hk, sk, d), dtype, layout, gen).requires_grad_(True)
        v = make((B, Hk, sk, d), dtype, layout, gen).requires_grad_(True)
        dout = torch.randn(B, H, sq, d, device="cuda", dtype=dtype, generator=gen)
        scale = 1.0 / math.sqrt(d)
        o = attention(q, k, v, causal=causal)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout)
        check(o.is_contiguous() and o.dtype == dtype and o.shape == (B, H, sq, d), f"{name}: O contiguous, dtype, shape")
        ref = reference(q, k, v, dout, causal, scale)
        ours = dict(zip(("O", "dQ", "dK", "dV"), (o, dq, dk, dv)))
        refs = dict(zip(("O", "dQ", "dK", "dV"), ref))
        if dtype == torch.float32:
            for key in ours:
                ma, rl2 = errors(ours[key], refs[key])
                check(rl2 <= 1e-5, f"{name}: {key} rel L2 {rl2:.2e} <= 1e-5 (max-abs {ma:.2e})")
            continue
        theirs = dict(zip(("O", "dQ", "dK", "dV"), torch_flash(q, k, v, dout, causal, scale)))
        for key in ours:
            ma, rl2 = errors(ours[key], refs[key])
            tma, trl2 = errors(theirs[key], refs[key])
            # The bar is on the whole tensor (relative L2 <= 1.2x torch flash's). A single element's max-abs
            # moves by one rounding of the 16-bit output (measured on an H100: 2.25e-3 vs torch's 1.65e-3 on
            # bf16 O with |O| ~ 0.5, where half a bf16 ulp is 1e-3), so it is held to 2x, not 1.2x.
            check(rl2 <= 1.2 * trl2 and ma <= 2.0 * tma,
                  f"{name}: {key} rel L2 {rl2:.3e} vs torch flash {trl2:.3e} (<= 1.2x), max-abs {ma:.3e} vs {tma:.3e} (<= 2x)")


# --- decoding ----------------------------------------------------------------------------------------
def tabled_decode_devices():
    """Device names whose committed table (configs/generated/*.hpp) holds a bf16 d 128 non-causal
    decode_splitkv entry: there the op must run it for Sq <= 16."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "generated")
    out = set()
    for path in glob.glob(os.path.join(root, "sm*.hpp")):
        text = open(path).read()
        m = re.search(r'kTable\{"((?:[^"\\]|\\.)*)"', text)
        if m and re.search(r'\{"decode_splitkv", "fwd", "bf16", 128, false,', text):
            out.add(m.group(1))
    return out


def decode_dispatch():
    gen = torch.Generator(device="cuda").manual_seed(SEED + 2)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    tabled = torch.cuda.get_device_name() in tabled_decode_devices()
    for causal in (False, True):
        e = explain(q, k, v, causal=causal)
        if tabled:
            check(e["family"] == "decode_splitkv", f"decoding (Sq 1, causal={causal}) on a GPU whose table has "
                                                   f"decode_splitkv runs it: {e['family']} {e['config']} ({e['source']})")
        else:
            print(f"note  no decode_splitkv entry for {torch.cuda.get_device_name()} in configs/generated: "
                  f"decoding runs {e['family']} ({e['source']})")
    q17 = torch.randn(2, 32, 17, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    check(explain(q17, k, v)["family"] != "decode_splitkv", "Sq 17 does not run decode_splitkv")


# --- packed variable-length batches ---------------------------------------------------------------------
VARLEN_CASES = [  # lengths q, lengths k (None: q's), H, Hk, d, causal, dtype, q from a packed qkv, loose max
    ([1, 130, 0, 257, 64], None, 8, 2, 128, True, torch.bfloat16, False, 0),
    ([100, 17, 300], [50, 200, 300], 4, 4, 64, False, torch.float16, True, 0),
    ([33, 190], [120, 7], 4, 1, 256, True, torch.bfloat16, False, 100),
]


def offsets(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def per_sequence(fn, q, k, v, dout, cu_q, cu_k, causal, scale):
    """fn (reference or torch_flash) on each sequence alone as [1, H, L, d]; its O, dQ, dK, dV packed back
    token-major. A sequence without queries contributes no O and zero dK, dV."""
    o, dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device), torch.zeros(q.shape, dtype=torch.float64,
                                                                                    device=q.device)
    dk, dv = (torch.zeros(k.shape, dtype=torch.float64, device=q.device) for _ in range(2))
    as_seq = lambda t, a, b: t[a:b].transpose(0, 1).unsqueeze(0)  # noqa: E731  [L, H, d] -> [1, H, L, d]
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = (cu_q[b], cu_q[b + 1]), (cu_k[b], cu_k[b + 1])
        if q1 == q0:
            continue
        r = fn(as_seq(q, q0, q1), as_seq(k, k0, k1), as_seq(v, k0, k1), as_seq(dout, q0, q1), causal, scale)
        back = [t[0].transpose(0, 1).double() for t in r]
        o[q0:q1], dq[q0:q1], dk[k0:k1], dv[k0:k1] = back
    return o, dq, dk, dv


def varlen_accuracy():
    gen = torch.Generator(device="cuda").manual_seed(SEED + 3)
    for lq, lk, H, Hk, d, causal, dtype, from_qkv, loose in VARLEN_CASES:
        lk = lk or lq
        cu_q, cu_k = offsets(lq), offsets(lk)
        name = (f"varlen {str(dtype).split('.')[-1]} H{H}/{Hk} d{d} q{lq} k{lk}{' causal' if causal else ''}"
                f"{' qkv' if from_qkv else ''}{' loose-max' if loose else ''}")
        if from_qkv:  # q a view of a packed projection: tokens (H + 2 Hk) d apart
            qkv = torch.randn(cu_q[-1], H + 2 * Hk, d, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
            q, leaf = qkv[:, :H], qkv
        else:
            q = torch.randn(cu_q[-1], H, d, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
            leaf = q
        k = torch.randn(cu_k[-1], Hk, d, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
        v = torch.randn(cu_k[-1], Hk, d, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
        dout = torch.randn(cu_q[-1], H, d, device="cuda", dtype=dtype, generator=gen)
        t_cu_q = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
        t_cu_k = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
        scale = 1.0 / math.sqrt(d)
        o = attention_varlen(q, k, v, t_cu_q, t_cu_k, max(lq) + loose, max(lk) + loose, causal=causal)
        check(o.shape == (cu_q[-1], H, d) and o.dtype == dtype and o.is_contiguous(), f"{name}: O shape, dtype, contiguous")
        grads = torch.autograd.grad(o, (leaf, k, v), dout)
        dq = grads[0][:, :H] if from_qkv else grads[0]
        if from_qkv:
            check(torch.count_nonzero(grads[0][:, H:]).item() == 0, f"{name}: no gradient into qkv's k and v part")
        qd = q.detach()
        ref = per_sequence(reference, qd, k.detach(), v.detach(), dout, cu_q, cu_k, causal, scale)
        theirs = per_sequence(torch_flash, qd, k.detach(), v.detach(), dout, cu_q, cu_k, causal, scale)
        for key, ours, r, t in zip(("O", "dQ", "dK", "dV"), (o, dq, grads[1], grads[2]), ref, theirs):
            ma, rl2 = errors(ours, r)
            tma, trl2 = errors(t, r)
            check(rl2 <= 1.2 * trl2 and ma <= 2.0 * tma,
                  f"{name}: {key} rel L2 {rl2:.3e} vs torch flash per sequence {trl2:.3e} (<= 1.2x), max-abs "
                  f"{ma:.3e} vs {tma:.3e} (<= 2x)")
        e = explain_varlen(qd, k, v, t_cu_q, t_cu_k, max(lq) + loose, max(lk) + loose, causal=causal)
        check(e["family"] in ("fa2_mma", "fa3_wgmma") and e.get("backward", {}).get("family") in
              ("fa2_mma_bwd", "fa2_wgmma_bwd"), f"{name}: explain_varlen(): {e['family']} {e['config']}, backward "
                                                f"{e.get('backward')}")

    # torch.compile(fullgraph=True): the custom ops give eager's output and gradients.
    lq = [40, 0, 97]
    cu = torch.tensor(offsets(lq), dtype=torch.int32, device="cuda")
    x = torch.randn(sum(lq), 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen)

    def f(q, k, v):
        return attention_varlen(q, k, v, cu, cu, max(lq), max(lq), causal=True)

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        q, k, v = (x.clone().requires_grad_(True) for _ in range(3))
        o = fn(q, k, v)
        o.float().square().sum().backward()
        outs.append([o.detach(), q.grad, k.grad, v.grad])
    check(torch.equal(outs[0][0], outs[1][0]), "attention_varlen under torch.compile(fullgraph=True): the same O as eager")
    # The backward's dQ sums by fp32 atomics in an order that varies run to run: bf16 results may differ by an
    # ulp (0.4%) in some elements, so the gradients are compared in relative L2, not bit for bit.
    worst = max((a.float() - b.float()).norm().item() / b.float().norm().clamp_min(1e-30).item()
                for a, b in zip(outs[0][1:], outs[1][1:]))
    check(worst <= 5e-3, f"attention_varlen under torch.compile(fullgraph=True): gradients match eager (rel L2 {worst:.2e})")
class TinyAttentionBlock(torch.nn.Module):
    def __init__(self, dim=256, heads=4, causal=True):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.attn = FlashAttention(head_dim=dim // heads, causal=causal)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        return x + self.proj(self.attn(q, k, v).transpose(1, 2).reshape(B, S, C))


def run_model(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = model(x)
    y.float().square().mean().backward()
    return [y.detach().float(), x.grad.float()] + [p.grad.float() for p in model.parameters()]


def compiled_and_autocast():
    torch.manual_seed(SEED)
    model = TinyAttentionBlock().cuda()
    x = torch.randn(2, 192, 256, device="cuda")
    eager = run_model(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    comp = run_model(compiled, x)
    worst = max((a - b).norm().item() / b.norm().clamp_min(1e-30).item() for a, b in zip(comp, eager))
    check(worst <= 1e-4, f"torch.compile(fullgraph=True) fp32: output and every gradient match eager (rel L2 {worst:.2e})")

    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager_ac = run_model(model, x)
        comp_ac = run_model(compiled, x)
    worst = max((a - b).norm().item() / b.norm().clamp_min(1e-30).item() for a, b in zip(comp_ac, eager_ac))
    check(worst <= 2e-2, f"torch.compile under autocast bf16 matches eager under autocast (rel L2 {worst:.2e})")
    rel = (eager_ac[0] - eager[0]).norm().item() / eager[0].norm().item()
    check(rel <= 2e-2, f"autocast bf16 output near the fp32 one (rel L2 {rel:.2e})")

    q, k, v = (torch.randn(2, 4, 100, 64, device="cuda", requires_grad=True) for _ in range(3))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = attention(q, k, v, causal=True)
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    check(o.dtype == torch.bfloat16 == o_sdpa.dtype, f"autocast: fp32 inputs give a {o.dtype} output, as SDPA ({o_sdpa.dtype})")
    o_bf = attention(q.detach().bfloat16(), k.detach().bfloat16(), v.detach().bfloat16(), causal=True)
    check(torch.equal(o, o_bf), "autocast: the same bits as calling with bf16 inputs")
    o.float().sum().backward()
    check(q.grad is not None and q.grad.dtype == torch.float32, "autocast: gradients reach the fp32 inputs in fp32")


def streams_module_explain():
    gen = torch.Generator(device="cuda").manual_seed(SEED + 1)
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    base = attention(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o_side = attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    check(torch.equal(base, o_side), "a side stream (torch.cuda.stream) gives the same bits")

    attn = FlashAttention(head_dim=64)
    Q, K, V = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = attn(Q, K, V)
    loss = out.float().pow(2).mean()
    loss.backward()
    check(all(t.grad is not None and torch.isfinite(t.grad).all().item() for t in (Q, K, V)),
          "FlashAttention(head_dim=64): out = attn(Q, K, V); loss.backward() gives finite gradients")

    e = explain(q, k, v, causal=True)
    keys = {"family", "config", "source", "cache", "device", "arch"}
    check(keys <= set(e) and e["source"] in ("db", "device", "arch", "default")
          and e["cache"] in ("memory", "disk", "jit", "aot") and e["device"] == torch.cuda.get_device_name()
          and e["arch"].startswith("sm_"), f"explain(): {e}")
    check(isinstance(e.get("backward"), dict) and "family" in e["backward"], f"explain() backward: {e.get('backward')}")


# --- errors ------------------------------------------------------------------------------------------
def raises(fn, exc, pattern, what):
    try:
        fn()
    except exc as e:
        msg = str(e)
        good = "\n" not in msg and pattern.lower() in msg.lower()
        check(good, f"{what}: {type(e).__name__}: {msg}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is a failure, reported
        check(False, f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        return
    check(False, f"{what}: no error raised")


def error_messages():
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    raises(lambda: attention(q.cpu(), q.cpu(), q.cpu()), ValueError, "CUDA", "CPU tensors")
    raises(lambda: attention(q, q.half(), q), TypeError, "mixed dtypes", "mixed dtypes")
    raises(lambda: attention(q[0], q[0], q[0]), ValueError, "4-D", "a 3-D tensor")
    q3 = torch.randn(1, 3, 64, 64, device="cuda", dtype=torch.bfloat16)
    raises(lambda: attention(q3, q3[:, :2], q3[:, :2]), ValueError, "dividing", "Hk not dividing Hq (3 / 2)")
    raises(lambda: attention(q, q[:, :1], q), ValueError, "same number", "k and v heads differ")
    raises(lambda: attention(q.double(), q.double(), q.double()), TypeError, "not supported", "float64")
    big = torch.randn(1, 2, 64, 512, device="cuda", dtype=torch.bfloat16)
    raises(lambda: attention(big, big, big), flashtune.UnsupportedError, "512", "head dim 512 (the runtime's FT_UNSUPPORTED)")
    check(issubclass(flashtune.UnsupportedError, ValueError), "UnsupportedError is a ValueError")

    # attention_varlen: q [30, 4, 64], k and v [30, 2, 64], three sequences of 10.
    p = torch.randn(30, 4, 64, device="cuda", dtype=torch.bfloat16)
    kv = p[:, :2].contiguous()
    cu = torch.tensor([0, 10, 20, 30], dtype=torch.int32, device="cuda")

    def av(q=p, k=kv, v=kv, cu_q=cu, cu_k=cu, mq=10, mk=10):
        return attention_varlen(q, k, v, cu_q, cu_k, mq, mk)

    raises(lambda: av(q=p[None]), ValueError, "3-D", "varlen: a 4-D q")
    raises(lambda: av(cu_q=cu.long()), ValueError, "torch.int32", "varlen: int64 offsets")
    raises(lambda: av(cu_k=cu.cpu()), ValueError, "kernels read it on the GPU", "varlen: offsets on the CPU")
    raises(lambda: av(cu_k=cu[:3]), ValueError, "both hold batch + 1", "varlen: offset counts differ")
    raises(lambda: av(cu_q=cu[:1], cu_k=cu[:1]), ValueError, "batch + 1 for a batch of 1", "varlen: one offset")
    raises(lambda: av(mq=torch.tensor(10)), TypeError, "max_seqlen_q must be an int", "varlen: max_seqlen a tensor")
    raises(lambda: av(mk=0), ValueError, "max_seqlen_k = 0 is out of range", "varlen: max_seqlen 0")
    raises(lambda: av(mq=9), ValueError, "more than batch 3 x max_seqlen_q 9", "varlen: tokens past batch x max")
    raises(lambda: av(q=p.float(), k=kv.float(), v=kv.float()), TypeError, "float16 or torch.bfloat16", "varlen: fp32")
    raises(lambda: av(k=p[:, :3].contiguous(), v=p[:, :3].contiguous()), ValueError, "dividing q's", "varlen: Hk 3 of 4")
    raises(lambda: av(v=kv[:20]), ValueError, "different token counts", "varlen: k and v tokens differ")
    raises(lambda: av(q=p.cpu()), ValueError, "CUDA", "varlen: q on the CPU")


def main():
    ok, why = flashtune.device_available()
    if not ok or not torch.cuda.is_available():
        print(f"FAIL  no GPU: flashtune says {why!r}, torch.cuda.is_available() = {torch.cuda.is_available()}")
        return 1
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, runtime {flashtune.runtime_version()}")
    for part in (error_messages, accuracy, decode_dispatch, varlen_accuracy, streams_module_explain, compiled_and_autocast):
        try:
            part()
        except Exception:  # noqa: BLE001 - one part's crash is reported and the rest still run
            traceback.print_exc()
            check(False, f"{part.__name__} raised")
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
