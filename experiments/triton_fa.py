#!/usr/bin/env python3
"""flashtune's own Triton FlashAttention (forward and backward), a baseline for the tuned kernels.

Conventions (the same as reference/attention_ref.cpp):
  * q [B, H, Sq, d], k and v [B, H, Sk, d]; made contiguous by the wrappers.
  * causal is bottom-right aligned: query i sees key j iff j <= i + Sk - Sq. A query row that sees no
    key (Sq > Sk) gives O = 0 and LSE = +inf.
  * LSE is natural-log: lse = m + log(l) over the scaled scores, stored in fp32 as [B, H, Sq].
  * the forward runs the online softmax in base 2 with the scale folded in (qk_scale = scale*log2(e)).
  * backward: delta = rowsum(dO * O); one kernel per K/V block walks the Q blocks (dK, dV), one kernel
    per Q block walks the K/V blocks (dQ). No atomics: every output element has one owner, so the
    result is deterministic run to run.
  * fp16/bf16: tensor-core tl.dot, P and dS rounded to the input format before their products, fp32
    accumulation. fp32: tl.dot with input_precision="ieee" (true fp32 products, no TF32).
  * head dims up to 256; the d axis is padded to a power of two (>= 16) with masked loads and stores.

attention(q, k, v, causal=False, sm_scale=None) is the autograd entry point; forward() and backward()
are the raw launches (optional pre-allocated outputs, which the baseline poisons with NaN before a
validated call).
"""
import os

import torch
import triton
import triton.language as tl


class Unsupported(ValueError):
    """A shape this kernel does not take (reported as status "unsupported")."""


# ------------------------------------------------------------------------------------------ kernels

@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    # fp32 inputs: full-precision products (Triton would otherwise use TF32 on tensor cores).
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, qk_scale, SQ, SK,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    q_base = Q + bh * SQ * HEAD_DIM
    o_base = O + bh * SQ * HEAD_DIM
    k_base = K + bh * SK * HEAD_DIM
    v_base = V + bh * SK * HEAD_DIM

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = rows < SQ
    if BLOCK_D == HEAD_DIM:
        q_mask = row_in[:, None]
    else:
        q_mask = row_in[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, base-2 scaled units
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # running sum of 2^(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    shift = SK - SQ  # bottom-right causal: key j visible to row i iff j <= i + shift
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M + shift, SK)  # one past the last key the block's last row sees
    else:
        hi = SK
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_in = cols < SK
        if BLOCK_D == HEAD_DIM:
            kt_mask = col_in[None, :]
            v_mask = col_in[:, None]
        else:
            kt_mask = col_in[None, :] & (offs_d[:, None] < HEAD_DIM)
            v_mask = col_in[:, None] & (offs_d[None, :] < HEAD_DIM)
        kT = tl.load(k_base + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=kt_mask, other=0.0)  # [D, N]
        s = _dot(q, kT, IEEE) * qk_scale                                                            # [M, N]
        ok = col_in[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows[:, None] + shift)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: no NaN
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=v_mask, other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new

    seen = l_i > 0.0
    l_div = tl.where(seen, l_i, 1.0)
    o = acc / l_div[:, None]  # fully masked rows: acc = 0, so O = 0
    lse = tl.where(seen, (m_i + tl.log2(l_div)) * 0.6931471805599453, float("inf"))
    tl.store(o_base + rows[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=q_mask)
    tl.store(LSE + bh * SQ + rows, lse, mask=row_in)


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, SQ,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = rows < SQ
    if BLOCK_D == HEAD_DIM:
        mask = row_in[:, None]
    else:
        mask = row_in[:, None] & (offs_d[None, :] < HEAD_DIM)
    off = bh * SQ * HEAD_DIM + rows[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(O + off, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * SQ + rows, tl.sum(o * do, 1), mask=row_in)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, qk_scale, SQ, SK,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    # One program per BLOCK_N keys of one (batch, head); walks the query blocks that see them.
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    q_base = Q + bh * SQ * HEAD_DIM
    do_base = DO + bh * SQ * HEAD_DIM
    kv_off = bh * SK * HEAD_DIM
    lse_base = LSE + bh * SQ
    delta_base = DELTA + bh * SQ

    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    col_in = cols < SK
    if BLOCK_D == HEAD_DIM:
        kv_mask = col_in[:, None]
    else:
        kv_mask = col_in[:, None] & (offs_d[None, :] < HEAD_DIM)
    kv_ptr = cols[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv_off + kv_ptr, mask=kv_mask, other=0.0)  # [N, D]
    v = tl.load(V + kv_off + kv_ptr, mask=kv_mask, other=0.0)  # [N, D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    shift = SK - SQ
    if CAUSAL:
        # the first row that sees key pid_n*BLOCK_N is pid_n*BLOCK_N - shift; start at its block
        lo = tl.maximum(pid_n * BLOCK_N - shift, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    for start_m in range(lo, SQ, BLOCK_M):
        rows = start_m + offs_m
        row_in = rows < SQ
        if BLOCK_D == HEAD_DIM:
            qt_mask = row_in[None, :]
            do_mask = row_in[:, None]
        else:
            qt_mask = row_in[None, :] & (offs_d[:, None] < HEAD_DIM)
            do_mask = row_in[:, None] & (offs_d[None, :] < HEAD_DIM)
        qT = tl.load(q_base + rows[None, :] * HEAD_DIM + offs_d[:, None], mask=qt_mask, other=0.0)  # [D, M]
        do = tl.load(do_base + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=do_mask, other=0.0)  # [M, D]
        lse2 = tl.load(lse_base + rows, mask=row_in, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_base + rows, mask=row_in, other=0.0)
        sT = _dot(k, qT, IEEE) * qk_scale  # [N, M], base-2 scaled scores
        ok = col_in[:, None] & row_in[None, :]
        if CAUSAL:
            ok = ok & (cols[:, None] <= rows[None, :] + shift)
        # masked entries may overflow to +inf inside exp2; tl.where drops them (no NaN: s is finite)
        pT = tl.where(ok, tl.exp2(sT - lse2[None, :]), 0.0)
        dv += _dot(pT.to(do.dtype), do, IEEE)
        dpT = _dot(v, tl.trans(do), IEEE)  # [N, M]
        dsT = pT * (dpT - delta[None, :])
        dk += _dot(dsT.to(qT.dtype), tl.trans(qT), IEEE)
    dk = dk * sm_scale
    tl.store(DK + kv_off + kv_ptr, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_off + kv_ptr, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, qk_scale, SQ, SK,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    # One program per BLOCK_M queries of one (batch, head); walks the key blocks they see.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    q_off = bh * SQ * HEAD_DIM
    k_base = K + bh * SK * HEAD_DIM
    v_base = V + bh * SK * HEAD_DIM

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = rows < SQ
    if BLOCK_D == HEAD_DIM:
        q_mask = row_in[:, None]
    else:
        q_mask = row_in[:, None] & (offs_d[None, :] < HEAD_DIM)
    q_ptr = rows[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + q_off + q_ptr, mask=q_mask, other=0.0)    # [M, D]
    do = tl.load(DO + q_off + q_ptr, mask=q_mask, other=0.0)  # [M, D]
    lse2 = tl.load(LSE + bh * SQ + rows, mask=row_in, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh * SQ + rows, mask=row_in, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    shift = SK - SQ
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M + shift, SK)
    else:
        hi = SK
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_in = cols < SK
        if BLOCK_D == HEAD_DIM:
            kt_mask = col_in[None, :]
        else:
            kt_mask = col_in[None, :] & (offs_d[:, None] < HEAD_DIM)
        kt_ptr = cols[None, :] * HEAD_DIM + offs_d[:, None]
        kT = tl.load(k_base + kt_ptr, mask=kt_mask, other=0.0)  # [D, N]
        vT = tl.load(v_base + kt_ptr, mask=kt_mask, other=0.0)  # [D, N]
        s = _dot(q, kT, IEEE) * qk_scale                       # [M, N]
        ok = row_in[:, None] & col_in[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows[:, None] + shift)
        p = tl.where(ok, tl.exp2(s - lse2[:, None]), 0.0)
        dp = _dot(do, vT, IEEE)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kT.dtype), tl.trans(kT), IEEE)
    dq = dq * sm_scale
    tl.store(DQ + q_off + q_ptr, dq.to(DQ.dtype.element_ty), mask=q_mask)


# ------------------------------------------------------------------------------------ block tables

# (BLOCK_M, BLOCK_N, num_warps, num_stages) by padded head dim. Fixed, chosen for an H100/H200 with
# shared memory to spare (<= ~130 KB per program), so no autotuning time is spent.
_FWD_16 = {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 3),
           256: (64, 32, 8, 2)}
_FWD_32 = {16: (64, 32, 4, 2), 32: (64, 32, 4, 2), 64: (64, 32, 4, 2), 128: (32, 32, 4, 2),
           256: (32, 16, 4, 1)}
# backward: (dK/dV: BLOCK_N keys per program, BLOCK_M queries per step, warps, stages),
#           (dQ: BLOCK_M queries per program, BLOCK_N keys per step, warps, stages)
_BWD_16 = {16: ((64, 64, 4, 2), (64, 64, 4, 2)), 32: ((64, 64, 4, 2), (64, 64, 4, 2)),
           64: ((64, 64, 4, 2), (64, 64, 4, 2)), 128: ((64, 32, 8, 2), (64, 32, 8, 2)),
           256: ((32, 32, 8, 1), (32, 32, 8, 1))}
_BWD_32 = {16: ((32, 32, 4, 1), (32, 32, 4, 1)), 32: ((32, 32, 4, 1), (32, 32, 4, 1)),
           64: ((32, 32, 4, 1), (32, 32, 4, 1)), 128: ((32, 16, 4, 1), (32, 16, 4, 1)),
           256: ((16, 16, 4, 1), (16, 16, 4, 1))}
_DELTA_BLOCK_M = 64


def block_d(head_dim):
    """The padded head dim: the next power of two, at least 16 (tl.dot's smallest K)."""
    if head_dim < 1 or head_dim > 256:
        raise Unsupported(f"triton_fa: head_dim {head_dim} not in 1..256")
    return max(16, triton.next_power_of_2(head_dim))


def _is_fp32(dtype):
    return dtype == torch.float32


def config_string(head_dim, dtype, direction="fwd"):
    """The block configuration used for a problem, as the row's "config" field."""
    bd = block_d(head_dim)
    if direction == "bwd":
        (kn, km, kw, ks), (qm, qn, qw, qs) = (_BWD_32 if _is_fp32(dtype) else _BWD_16)[bd]
        return (f"dkdv:BLOCK_N={kn},BLOCK_M={km},WARPS={kw},STAGES={ks};"
                f"dq:BLOCK_M={qm},BLOCK_N={qn},WARPS={qw},STAGES={qs}")
    bm, bn, w, s = (_FWD_32 if _is_fp32(dtype) else _FWD_16)[bd]
    return f"BLOCK_M={bm},BLOCK_N={bn},WARPS={w},STAGES={s}"


# ------------------------------------------------------------------------------------- launchers

_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_inputs(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Unsupported("triton_fa: q, k, v must be [B, H, S, d]")
    B, H, Sq, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise Unsupported(f"triton_fa: shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} disagree")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise Unsupported(f"triton_fa: dtype {q.dtype} (q, k, v must share fp16, bf16 or fp32)")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter runs on CPU tensors
        raise Unsupported("triton_fa: CUDA tensors only")
    if B * H > 65535:
        raise Unsupported(f"triton_fa: B*H = {B * H} over the grid's 65535")
    block_d(d)


def _out_buffer(buf, shape, dtype, device):
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(buf.shape) != tuple(shape) or buf.dtype != dtype or not buf.is_contiguous():
        raise ValueError(f"triton_fa: output buffer {tuple(buf.shape)} {buf.dtype} must be contiguous {shape} {dtype}")
    return buf


def forward(q, k, v, causal=False, sm_scale=None, o=None, lse=None):
    """O [B, H, Sq, d] (input dtype) and LSE [B, H, Sq] (fp32, natural log, +inf on fully masked rows)."""
    _check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Sq, d = q.shape
    Sk = k.shape[2]
    if sm_scale is None:
        sm_scale = d ** -0.5
    o = _out_buffer(o, (B, H, Sq, d), q.dtype, q.device)
    lse = _out_buffer(lse, (B, H, Sq), torch.float32, q.device)
    if Sq == 0 or B * H == 0:
        return o, lse
    bd = block_d(d)
    bm, bn, warps, stages = (_FWD_32 if _is_fp32(q.dtype) else _FWD_16)[bd]
    grid = (triton.cdiv(Sq, bm), B * H)
    _fwd_kernel[grid](q, k, v, o, lse, float(sm_scale) * _LOG2E, Sq, Sk,
                      HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal),
                      IEEE=_is_fp32(q.dtype), num_warps=warps, num_stages=stages)
    return o, lse


def backward(q, k, v, o, lse, do, causal=False, sm_scale=None, dq=None, dk=None, dv=None):
    """dQ, dK, dV (input dtype) from the forward's O and LSE and the incoming dO."""
    _check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o, do, lse = o.contiguous(), do.contiguous(), lse.contiguous()
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    B, H, Sq, d = q.shape
    Sk = k.shape[2]
    if sm_scale is None:
        sm_scale = d ** -0.5
    dq = _out_buffer(dq, (B, H, Sq, d), q.dtype, q.device)
    dk = _out_buffer(dk, (B, H, Sk, d), q.dtype, q.device)
    dv = _out_buffer(dv, (B, H, Sk, d), q.dtype, q.device)
    if B * H == 0:
        return dq, dk, dv
    if Sq == 0 or Sk == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return dq, dk, dv
    bd = block_d(d)
    ieee = _is_fp32(q.dtype)
    (kn, km, kw, ks), (qm, qn, qw, qs) = (_BWD_32 if ieee else _BWD_16)[bd]
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    _bwd_delta_kernel[(triton.cdiv(Sq, _DELTA_BLOCK_M), B * H)](
        o, do, delta, Sq, HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=_DELTA_BLOCK_M, num_warps=4)
    scale = float(sm_scale)
    _bwd_dkdv_kernel[(triton.cdiv(Sk, kn), B * H)](
        q, k, v, do, lse, delta, dk, dv, scale, scale * _LOG2E, Sq, Sk,
        HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=km, BLOCK_N=kn, CAUSAL=bool(causal), IEEE=ieee,
        num_warps=kw, num_stages=ks)
    _bwd_dq_kernel[(triton.cdiv(Sq, qm), B * H)](
        q, k, v, do, lse, delta, dq, scale, scale * _LOG2E, Sq, Sk,
        HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=qm, BLOCK_N=qn, CAUSAL=bool(causal), IEEE=ieee,
        num_warps=qw, num_stages=qs)
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, return_lse):
        o, lse = forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        ctx.set_materialize_grads(False)  # no zero tensor for the LSE's (unused) gradient
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    def backward(ctx, do, *unused):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            return None, None, None, None, None, None
        dq, dk, dv = backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None, None


def attention(q, k, v, causal=False, sm_scale=None, return_lse=False):
    """softmax(q k^T * sm_scale, bottom-right causal mask) v with autograd; q, k, v [B, H, S, d].
    return_lse=True: (O, LSE), the LSE [B, H, Sq] fp32 natural-log and not differentiable."""
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    return _Attention.apply(q, k, v, bool(causal), float(sm_scale), bool(return_lse))


if __name__ == "__main__":
    # Quick self-check against float64 on the GPU: python3 experiments/triton_fa.py
    # (on a CPU through Triton's interpreter: TRITON_INTERPRET=1 python3 experiments/triton_fa.py)
    dev = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for d in (64, 96):
            for causal in (False, True):
                for sq, sk in ((100, 257), (300, 77)):
                    q = torch.randn(2, 3, sq, d, device=dev, dtype=dtype, requires_grad=True)
                    k = torch.randn(2, 3, sk, d, device=dev, dtype=dtype, requires_grad=True)
                    v = torch.randn(2, 3, sk, d, device=dev, dtype=dtype, requires_grad=True)
                    o = attention(q, k, v, causal)
                    do = torch.randn_like(o)
                    g = torch.autograd.grad(o, (q, k, v), do)
                    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
                    s = q64 @ k64.transpose(-1, -2) * d ** -0.5
                    if causal:
                        i = torch.arange(sq, device=dev)[:, None]
                        j = torch.arange(sk, device=dev)[None, :]
                        s = s.masked_fill(j > i + sk - sq, float("-inf"))
                    p = torch.softmax(s, -1).nan_to_num(0.0)
                    o64 = p @ v64
                    g64 = torch.autograd.grad(o64, (q64, k64, v64), do.double())
                    errs = [(o.double() - o64).abs().max().item()] + \
                           [((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(g, g64)]
                    print(f"{str(dtype):15} d{d:<4} causal={int(causal)} Sq{sq:<4} Sk{sk:<4} "
                          f"O max_abs {errs[0]:.2e}  dq/dk/dv rel_l2 {errs[1]:.2e} {errs[2]:.2e} {errs[3]:.2e}")
