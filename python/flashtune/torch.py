"""flashtune for PyTorch: a custom op with autograd, a FlashAttention module, and explain().

    from flashtune.torch import attention, attention_varlen, FlashAttention, explain
    o = attention(q, k, v, causal=True)          # q [B, H, Sq, d], k and v [B, H or Hk, Sk, d], as torch SDPA
    o, lse = attention(q, k, v, return_lse=True)  # lse [B, H, Sq] fp32, natural log (softmax_lse)
    attn = FlashAttention(head_dim=64); o = attn(q, k, v); o.sum().backward()
    # packed variable-length batches, as flash_attn_varlen_func: q [total_q, H, d], k and v [total_k, Hk, d],
    # cu_seqlens int32 [batch + 1] on the GPU
    o = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)
    # decoding from a paged K/V cache (forward only): q [B, H, Sq <= 16, d], pools [num_pages, Hk, page_size, d]
    # (layout="nhd": FlashAttention's/vLLM's [num_pages, page_size, Hk, d]), block_table int32 [B, max_pages] and
    # cache_seqlens int32 [B] on the GPU
    o = attention_paged(q, k_pages, v_pages, block_table, cache_seqlens)

Two backends run the same ops. The compiled extension libflashtune_torch.so (python/csrc, built where torch
imports at build time: `pip install --no-build-isolation .`, or the CMake build) registers them from C++ as
torch.ops.flashtune.*, with C++ autograd, and calls the runtime directly; where it is missing or does not load
(another torch), the ctypes fallback registers the same ops in Python as torch.ops.flashtune_ctypes.*. backend()
says which runs and why; $FLASHTUNE_TORCH_LIBRARY names the extension's file (0: the fallback).

The op is torch.ops.flashtune.attention_fwd (q, k, v, causal, scale, deterministic, window_left, window_right,
softcap) -> (o, lse) with the backward op torch.ops.flashtune.attention_bwd (dout, q, k, v, o, lse, causal, scale,
...the same four) -> (dq, dk, dv); the last four have defaults (False, -1, -1, 0.0: none); both have
fake (meta) implementations, so they work in eager mode, under torch.compile (fullgraph), in CUDA graphs and
under torch.autocast("cuda"): floating inputs are cast to the autocast dtype first, as SDPA's are. Calls run
on torch.cuda.current_stream(); inputs keep their strides (the runtime packs a non-contiguous layout),
outputs are contiguous. causal is bottom-right aligned (query i sees keys j <= i + Sk - Sq), as
FlashAttention; a query row that sees no key gives O = 0 and LSE = +inf. lse is the natural log of each row's
softmax denominator, of the scaled scores (FlashAttention's softmax_lse); attention(..., return_lse=True) returns
it beside o, without a gradient (backpropagating through lse raises). scale 0.0 in the ops means
1/sqrt(head_dim). Decoding (Sq <= 16 against a K/V cache) goes through the same op: the runtime runs its
split-KV family there where it has a config for it (explain() names the family).

Packed variable-length batches: torch.ops.flashtune.attention_varlen_fwd (q, k, v, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale) -> (o, lse [H, total_q]) and
attention_varlen_bwd (dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
causal, scale) -> (dq, dk, dv), likewise with fake implementations and autograd.

Paged K/V caches: torch.ops.flashtune.attention_paged_fwd (q, k_pages, v_pages, block_table, cache_seqlens,
causal, scale, max_seqlen_k, layout: 0 hnd, 1 nhd) -> (o, lse), with a fake implementation and no autograd: decoding is inference
(attention_paged() refuses inputs that would need a backward).

Mask predicates (attention(..., mask_mod=..., mask_tensors=...)): torch.ops.flashtune_ctypes.attention_mask_fwd (q, k,
v, causal, scale, mask_mod, mask_names, mask_tensors, deterministic, window_left, window_right, softcap,
alibi_slopes) -> (o, lse) and attention_mask_bwd (dout, q, k, v, o, lse, causal, scale, mask_mod, mask_names,
mask_tensors, ...the same five) -> (dq, dk, dv): mask_mod the predicate's text, mask_names the tensors' names joined
by ',' and mask_tensors (Tensor[]) the int32 tensors in that order. They run through ctypes in either backend (the
extension has no masked op), with fake implementations and autograd, so that torch.compile traces such a call.
"""
import contextlib
import ctypes
import math
import operator
import os
import re
import subprocess
import warnings
from typing import Optional

import torch

from . import _autotune, _lib

__all__ = ["attention", "attention_varlen", "attention_paged", "attention_with_kvcache", "FlashAttention", "explain",
           "explain_varlen", "autotune", "explain_paged", "backend"]

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_NAMES = ("q", "k", "v")


# --- validation (one line each; runs under torch.compile too: nothing here reads data) ------------
def _check_tensors(fn, names, tensors):
    for n, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {n} must be a torch.Tensor, got {type(t).__name__}")


def _check_qkv_devices(fn, q, k, v):
    """q, k, v on one CUDA device."""
    for n, t in zip(_NAMES, (q, k, v)):
        if t.device.type != "cuda":
            raise ValueError(f"{fn}: {n} is on {t.device}; flashtune runs on CUDA tensors (move them with .cuda())")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"{fn}: q, k, v are on different devices ({q.device}, {k.device}, {v.device})")


def _check(q, k, v, fn, autocast=False):
    _check_tensors(fn, _NAMES, (q, k, v))
    for n, t in zip(_NAMES, (q, k, v)):
        if t.dim() != 4:
            raise ValueError(f"{fn}: {n} must be 4-D [batch, heads, seq, head_dim] (torch SDPA's layout), "
                             f"got shape {tuple(t.shape)}")
    _check_qkv_devices(fn, q, k, v)
    if autocast and torch.is_autocast_enabled("cuda"):  # as SDPA: floating inputs in the autocast dtype
        dt = torch.get_autocast_dtype("cuda")
        q, k, v = [t.to(dt) if t.is_floating_point() else t for t in (q, k, v)]
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: mixed dtypes (q {q.dtype}, k {k.dtype}, v {v.dtype}); give all three one dtype")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{fn}: dtype {q.dtype} is not supported; use torch.float32, torch.float16 or torch.bfloat16")
    B, H, Sq, d = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{fn}: batch sizes differ (q {B}, k {k.shape[0]}, v {v.shape[0]})")
    if v.shape[1] != k.shape[1] or k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"{fn}: q has {H} heads, k {k.shape[1]} and v {v.shape[1]}; k and v need the same number "
                         f"of heads, dividing q's (grouped-query attention, as torch SDPA's enable_gqa=True)")
    if k.shape[3] != d or v.shape[3] != d:
        raise ValueError(f"{fn}: head dims differ (q {d}, k {k.shape[3]}, v {v.shape[3]})")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"{fn}: k and v have different sequence lengths ({k.shape[2]}, {v.shape[2]})")
    return q, k, v


def _autocast_cast(q, k, v):
    """Under torch.autocast("cuda"), floating CUDA tensors in the autocast dtype, as SDPA takes them; the rest
    as given, for the extension's checks to name (its one-line errors are the same as _check's). The hot path
    of a training step: two dtype compares where nothing is cast (the full _check in Python took more host
    time per call than the op's own checks in C++)."""
    dt = torch.get_autocast_dtype("cuda")
    ts = (q, k, v)
    if all(isinstance(t, torch.Tensor) and t.dtype == dt for t in ts):
        return ts
    return tuple(t.to(dt) if isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point() else t for t in ts)


_VARLEN_NAMES = ("cu_seqlens_q", "cu_seqlens_k")


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn, autocast=False):
    """The packed layout's checks, one line each: q [total_q, H, d], k and v [total_k, Hk, d] on one CUDA
    device, fp16/bf16; cu_seqlens int32 [batch + 1] on q's device (their values are device memory: not
    read, as FlashAttention does not read them; attention.h says what that trusts); max_seqlen ints >= 1.
    Returns (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    _check_tensors(fn, _NAMES + _VARLEN_NAMES, (q, k, v, cu_seqlens_q, cu_seqlens_k))
    for n, t in zip(_NAMES, (q, k, v)):
        if t.dim() != 3:
            raise ValueError(f"{fn}: {n} must be 3-D [total_tokens, heads, head_dim] (flash_attn_varlen_func's "
                             f"layout), got shape {tuple(t.shape)}")
    _check_qkv_devices(fn, q, k, v)
    for n, t in zip(_VARLEN_NAMES, (cu_seqlens_q, cu_seqlens_k)):
        if t.dim() != 1 or t.dtype != torch.int32:
            raise ValueError(f"{fn}: {n} must be a 1-D torch.int32 tensor of batch + 1 offsets, got "
                             f"{t.dtype} of shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{fn}: {n} is on {t.device}, q on {q.device}; the kernels read it on the GPU")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"{fn}: cu_seqlens_q has {cu_seqlens_q.numel()} offsets, cu_seqlens_k "
                         f"{cu_seqlens_k.numel()}; both hold batch + 1")
    batch = cu_seqlens_q.numel() - 1
    if not 1 <= batch <= _lib.MAX_VARLEN_SEQS:
        raise ValueError(f"{fn}: cu_seqlens_q has {batch + 1} offsets: batch + 1 for a batch of 1 to "
                         f"{_lib.MAX_VARLEN_SEQS} sequences")
    lengths = []
    for n, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(x, (bool, torch.Tensor)):  # a tensor would be read from the GPU: pass an int
            raise TypeError(f"{fn}: {n} must be an int, got {type(x).__name__}")
        try:
            x = operator.index(x)
        except TypeError:
            raise TypeError(f"{fn}: {n} must be an int, got {type(x).__name__}") from None
        if not 1 <= x <= _lib.MAX_VARLEN_TOKENS:
            raise ValueError(f"{fn}: {n} = {x} is out of range [1, {_lib.MAX_VARLEN_TOKENS}]")
        lengths.append(x)
    if autocast and torch.is_autocast_enabled("cuda"):  # as the dense op: floating inputs in the autocast dtype
        dt = torch.get_autocast_dtype("cuda")
        q, k, v = [t.to(dt) if t.is_floating_point() else t for t in (q, k, v)]
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: mixed dtypes (q {q.dtype}, k {k.dtype}, v {v.dtype}); give all three one dtype")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{fn}: dtype {q.dtype} is not supported for packed batches; use torch.float16 or "
                        f"torch.bfloat16")
    Tq, H, d = q.shape
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"{fn}: k and v have different token counts ({k.shape[0]}, {v.shape[0]})")
    if v.shape[1] != k.shape[1] or k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"{fn}: q has {H} heads, k {k.shape[1]} and v {v.shape[1]}; k and v need the same number "
                         f"of heads, dividing q's (grouped-query attention)")
    if k.shape[2] != d or v.shape[2] != d:
        raise ValueError(f"{fn}: head dims differ (q {d}, k {k.shape[2]}, v {v.shape[2]})")
    for n, total, longest in (("q", Tq, lengths[0]), ("k", k.shape[0], lengths[1])):
        if total > batch * longest:
            raise ValueError(f"{fn}: {n} has {total} tokens, more than batch {batch} x max_seqlen_{n} {longest}: "
                             f"some sequence would be longer than max_seqlen_{n}")
    if cu_seqlens_q.stride(0) != 1:
        cu_seqlens_q = cu_seqlens_q.contiguous()
    if cu_seqlens_k.stride(0) != 1:
        cu_seqlens_k = cu_seqlens_k.contiguous()
    return q, k, v, cu_seqlens_q, cu_seqlens_k, lengths[0], lengths[1]


_PAGED_NAMES = ("q", "k_pages", "v_pages", "block_table", "cache_seqlens")


# The pools' shape in each layout, and which of their dimensions hold the kv heads and the page's keys.
_POOL_SHAPES = {_lib.FT_PAGES_HND: ("[num_pages, heads_k, page_size, head_dim]", 1, 2),
                _lib.FT_PAGES_NHD: ("[num_pages, page_size, heads_k, head_dim]", 2, 1)}


def _pool_dims(pool, layout_code):
    """(num_pages, heads_k, page_size) of a 4-D pool in its layout."""
    _, hk_dim, page_dim = _POOL_SHAPES[layout_code]
    return pool.shape[0], pool.shape[hk_dim], pool.shape[page_dim]


def _check_paged(q, k_pages, v_pages, block_table, cache_seqlens, max_seqlen_k, fn, autocast=False,
                 layout_code=_lib.FT_PAGES_HND):
    """The paged layout's checks, one line each: q [B, H, Sq, d] (torch SDPA's layout, any strides), the pools
    [num_pages, Hk, page_size, d] (layout_code FT_PAGES_NHD: [num_pages, page_size, Hk, d], FlashAttention's and
    vLLM's) contiguous (read in place: never copied), block_table int32 [B, max_pages] and
    cache_seqlens int32 [B], all on one CUDA device; fp16/bf16, q in the pools' dtype (under autocast q is cast
    to the autocast dtype first, the cache never: a copy of it would cost more than the call). The tables'
    values are device memory: not read (attention.h says what that trusts). The runtime checks Sq, the head
    dim and the page size (flashtune.UnsupportedError). Returns (q, block_table, cache_seqlens, max_seqlen_k)."""
    _check_tensors(fn, _PAGED_NAMES, (q, k_pages, v_pages, block_table, cache_seqlens))
    pool_shape = _POOL_SHAPES[layout_code][0]
    for n, t, want in (("q", q, "[batch, heads, seq_q, head_dim] (torch SDPA's layout)"),
                       ("k_pages", k_pages, pool_shape), ("v_pages", v_pages, pool_shape)):
        if t.dim() != 4:
            raise ValueError(f"{fn}: {n} must be 4-D {want}, got shape {tuple(t.shape)}")
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        raise ValueError(f"{fn}: block_table must be a 2-D torch.int32 tensor [batch, max_pages], got "
                         f"{block_table.dtype} of shape {tuple(block_table.shape)}")
    if cache_seqlens.dim() != 1 or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"{fn}: cache_seqlens must be a 1-D torch.int32 tensor [batch], got {cache_seqlens.dtype} of "
                         f"shape {tuple(cache_seqlens.shape)}")
    if q.device.type != "cuda":
        raise ValueError(f"{fn}: q is on {q.device}; flashtune runs on CUDA tensors (move them with .cuda())")
    for n, t in zip(_PAGED_NAMES[1:], (k_pages, v_pages, block_table, cache_seqlens)):
        if t.device != q.device:
            raise ValueError(f"{fn}: {n} is on {t.device}, q on {q.device}; the kernels read every tensor on q's GPU")
    if autocast and torch.is_autocast_enabled("cuda") and q.is_floating_point():
        q = q.to(torch.get_autocast_dtype("cuda"))
    if k_pages.dtype != v_pages.dtype:
        raise TypeError(f"{fn}: k_pages is {k_pages.dtype}, v_pages {v_pages.dtype}; give both pools one dtype")
    if k_pages.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{fn}: dtype {k_pages.dtype} is not supported for paged caches; use torch.float16 or "
                        f"torch.bfloat16")
    if q.dtype != k_pages.dtype:
        raise TypeError(f"{fn}: q is {q.dtype}, the cache {k_pages.dtype}; give q the cache's dtype (the cache is "
                        f"never cast)")
    B, H, Sq, d = q.shape
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"{fn}: k_pages {tuple(k_pages.shape)} and v_pages {tuple(v_pages.shape)} differ in shape")
    num_pages, Hk, page_size = _pool_dims(k_pages, layout_code)
    dk = k_pages.shape[3]
    if Hk == 0 or H % Hk:
        raise ValueError(f"{fn}: q has {H} heads, the pools {Hk} (pools {pool_shape}: layout "
                         f"{'nhd' if layout_code == _lib.FT_PAGES_NHD else 'hnd'}); the pools' heads must divide q's "
                         f"(grouped-query attention)")
    if dk != d:
        raise ValueError(f"{fn}: head dims differ (q {d}, pools {dk})")
    for n, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {n} must be contiguous {pool_shape} (it is read in place, never copied), got "
                             f"strides {t.stride()}")
    if block_table.shape[0] != B or cache_seqlens.shape[0] != B:
        raise ValueError(f"{fn}: batch sizes differ (q {B}, block_table {block_table.shape[0]}, cache_seqlens "
                         f"{cache_seqlens.shape[0]})")
    if block_table.shape[1] == 0:
        raise ValueError(f"{fn}: block_table has no columns (max_pages must be at least 1)")
    if max_seqlen_k is None:
        max_seqlen_k = 0  # the runtime's max_pages x page_size
    else:
        if isinstance(max_seqlen_k, (bool, torch.Tensor)):  # a tensor would be read from the GPU: pass an int
            raise TypeError(f"{fn}: max_seqlen_k must be an int or None, got {type(max_seqlen_k).__name__}")
        try:
            max_seqlen_k = operator.index(max_seqlen_k)
        except TypeError:
            raise TypeError(f"{fn}: max_seqlen_k must be an int or None, got {type(max_seqlen_k).__name__}") from None
        capacity = block_table.shape[1] * page_size
        if not 0 <= max_seqlen_k <= capacity:
            raise ValueError(f"{fn}: max_seqlen_k = {max_seqlen_k} is out of range [0, max_pages x page_size = "
                             f"{capacity}]")
    if block_table.stride(1) != 1 or block_table.stride(0) != block_table.shape[1]:
        block_table = block_table.contiguous()  # the kernels step rows by max_pages
    if cache_seqlens.stride(0) != 1:
        cache_seqlens = cache_seqlens.contiguous()
    return q, block_table, cache_seqlens, max_seqlen_k


def _scale(scale):
    if scale is None:
        return 0.0  # the runtime's 1/sqrt(head_dim)
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"flashtune.torch.attention: scale must be a positive finite number or None, got {scale}")
    return s


# --- tensors as the runtime takes them -------------------------------------------------------------
# Everything here runs twice per training step: each line is kept cheap (one stride() call per tensor,
# one struct.pack_into per call) because its host time shows in a step's time when the GPU waits for it
# (experiments/probes/host_time.py).
_DTYPE_CODES = {t: _lib.DTYPES[n] for t, n in _DTYPES.items()}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # internal: the stream without a Stream object


def _runtime_layout(t):
    """t when its layout can go to the runtime as it is (unit-stride head dim, positive strides, no two
    elements at one address), else a contiguous copy. Any rank: [B, H, S, d] or packed [total, H, d]."""
    if t.is_contiguous():
        return t
    st, sh = t.stride(), t.shape
    dims = sorted((st[i], sh[i]) for i in range(t.dim()) if sh[i] != 1)
    ok = sh[-1] == 1 or st[-1] == 1
    span = 1
    for stride, size in dims:
        if stride < span:
            ok = False
            break
        span = stride * size
    return t if ok else t.contiguous()


def _ref(t):
    """(pointer, 4 strides); a size-1 dim, whose stride torch leaves arbitrary, gets 0 (never read)."""
    st, sh = t.stride(), t.shape
    return (t.data_ptr(), st[0] if sh[0] != 1 else 0, st[1] if sh[1] != 1 else 0, st[2] if sh[2] != 1 else 0,
            st[3] if sh[3] != 1 else 0)


def _ref3(t):
    """(pointer, 3 strides) of a packed [total, H, d] tensor; size-1 dims get stride 0."""
    st, sh = t.stride(), t.shape
    return (t.data_ptr(), st[0] if sh[0] != 1 else 0, st[1] if sh[1] != 1 else 0, st[2] if sh[2] != 1 else 0)


def _stream(device):
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def _on(device):
    """The device's context for the runtime call: a no-op when it is current already (the usual case)."""
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


# The score modifications as the ops carry them: (window_left, window_right, softcap, alibi_slopes), FlashAttention's
# window_size, softcap and alibi_slopes; NO_MODS: none.
NO_MODS = (-1, -1, 0.0, None)
_NO_WINDOW = (-1, -1)  # window_size's default


def _alibi(fn, slopes, q, batch=None):
    """ALiBi's slopes as the kernels read them: fp32 [H] or [batch, H] on q's device (FlashAttention's alibi_slopes),
    contiguous (a strided tensor is copied: a few bytes); TypeError/ValueError (one line) otherwise."""
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"{fn}: alibi_slopes must be a torch.Tensor ([heads] or [batch, heads] fp32) or None, "
                        f"got {type(slopes).__name__}")
    if slopes.dtype != torch.float32:
        raise TypeError(f"{fn}: alibi_slopes must be torch.float32 (FlashAttention's), got {slopes.dtype}")
    if not isinstance(q, torch.Tensor) or q.dim() not in (3, 4):
        return slopes  # q's own check says what is wrong with it
    if slopes.device != q.device:
        raise ValueError(f"{fn}: alibi_slopes is on {slopes.device}, q on {q.device}; the kernels read it on q's GPU")
    H = q.shape[1]  # packed [total, H, d] (batch: the sequences) or [B, H, S, d]
    batch = q.shape[0] if batch is None else batch
    if tuple(slopes.shape) not in ((H,), (batch, H)):
        raise ValueError(f"{fn}: alibi_slopes must have shape ({H},) or ({batch}, {H}) ([heads] or [batch, heads]), "
                         f"got {tuple(slopes.shape)}")
    return slopes if slopes.is_contiguous() else slopes.contiguous()


def _mods(fn, window_size, softcap, alibi_slopes=None):
    """(window_left, window_right, softcap, alibi_slopes) from attention()'s keywords, window and softcap checked (one
    line); the slopes as given (checked against q by _alibi)."""
    if window_size == (-1, -1) and softcap == 0:
        return NO_MODS if alibi_slopes is None else (-1, -1, 0.0, alibi_slopes)
    try:
        window, left, right, cap, _, _ = _lib.mods_tuple(window_size, softcap)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: {e}") from None
    return (left, right, cap, alibi_slopes) if window else (-1, -1, cap, alibi_slopes)


def _with_alibi(fn, mods, q, batch=None):
    """mods with its slopes checked against q (_alibi), or mods as they are when they hold none."""
    if mods[3] is None:
        return mods
    return mods[:3] + (_alibi(fn, mods[3], q, batch),)


def _ft_mods(mods):
    """The ops' (window_left, window_right, softcap, alibi_slopes) as the runtime's ft_mods tuple (window, left, right,
    softcap, slopes pointer, slopes batch stride: 0 for [H]). Not checked again here: attention() checked them (_mods,
    _alibi), and the runtime checks every field."""
    left, right, cap, slopes = mods
    ptr, stride = (0, 0) if slopes is None else (slopes.data_ptr(), slopes.shape[1] if slopes.dim() == 2 else 0)
    return (1, left, right, cap, ptr, stride) if left >= 0 or right >= 0 else (0, 0, 0, cap, ptr, stride)


def _fwd_args(q, k, v, o, lse, causal, scale, mods=NO_MODS, mask=None):
    B, H, Sq, d = q.shape
    return _lib.pack_forward((B, H, Sq, k.shape[2], d), _DTYPE_CODES[q.dtype], 1 if causal else 0, scale,
                             _ref(q), _ref(k), _ref(v), _ref(o), lse.data_ptr(), k.shape[1], _ft_mods(mods),
                             0 if mask is None else mask.address())


def _bwd_args(dout, q, k, v, o, lse, dq, dk, dv, causal, scale, deterministic=False, mods=NO_MODS, mask=None):
    B, H, Sq, d = q.shape
    return _lib.pack_backward((B, H, Sq, k.shape[2], d), _DTYPE_CODES[q.dtype], 1 if causal else 0, scale,
                              _ref(q), _ref(k), _ref(v), _ref(o), _ref(dout), lse.data_ptr(),
                              _ref(dq), _ref(dk), _ref(dv), k.shape[1], 1 if deterministic else 0, _ft_mods(mods),
                              0 if mask is None else mask.address())


class _Mask:
    """A mask_mod call's predicate and tensors as the runtime takes them (ft_mask_mod): the struct, and the tensors
    it points at kept alive with it. Each tensor's _version is the struct's version: PyTorch bumps it on every
    in-place write, so the runtime's block summary, kept per (predicate, tensors, versions, shape, stream), is made
    again after one (attention.h)."""

    def __init__(self, predicate, tensors):
        self.tensors = tensors  # name -> int32 CUDA tensor, contiguous 1-D
        names = list(tensors)
        self.struct = _lib.mask_mod_struct(predicate, names, [tensors[n].data_ptr() for n in names],
                                           [tensors[n].numel() for n in names],
                                           [tensors[n]._version for n in names])

    def address(self):
        return ctypes.addressof(self.struct)


def _mask_tensors(fn, mask_mod, mask_tensors, q, window_size):
    """attention()'s mask_mod and mask_tensors checked in Python (one line each: TypeError for a type, ValueError for a
    value): (mask_mod, names, tensors), names the tensors' names joined by ',' (the ops' mask_names: a schema has no
    list of str) and tensors theirs in that order, contiguous. Reads no data and calls no C, so it runs under
    torch.compile too; the text itself is checked by _check_mask_text (eager) or by the runtime at the call."""
    if mask_mod is None:
        raise ValueError(f"{fn}: mask_tensors goes with mask_mod")
    if not isinstance(mask_mod, str):
        raise TypeError(f"{fn}: mask_mod must be a str (the body of bool mask(int b, int h, int q_idx, int kv_idx)), "
                        f"got {type(mask_mod).__name__}")
    if mask_tensors is None:
        mask_tensors = {}
    if not isinstance(mask_tensors, dict):
        raise TypeError(f"{fn}: mask_tensors must be a dict name -> torch.int32 CUDA tensor, got "
                        f"{type(mask_tensors).__name__}")
    if tuple(window_size) != _NO_WINDOW:
        raise ValueError(f"{fn}: mask_mod and window_size do not combine: write the window in the predicate")
    names, tensors = [], []
    for name, t in mask_tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"{fn}: mask_tensors' names must be str, got {type(name).__name__}")
        if "," in name or not name:
            raise ValueError(f"{fn}: mask_tensors' names are C++ identifiers, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: mask_tensors['{name}'] must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{fn}: mask_tensors['{name}'] must be torch.int32, got {t.dtype}")
        if t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"{fn}: mask_tensors['{name}'] must be a non-empty 1-D tensor, got shape {tuple(t.shape)}")
        if isinstance(q, torch.Tensor) and t.device != q.device:
            raise ValueError(f"{fn}: mask_tensors['{name}'] is on {t.device}, q on {q.device}; the kernels read it on "
                             f"q's GPU")
        names.append(name)
        tensors.append(t if t.is_contiguous() else t.contiguous())
    return mask_mod, ",".join(names), tensors


def _mask_names(fn, mask_names, mask_tensors):
    """The ops' mask_names (names joined by ',') as a dict name -> tensor with mask_tensors; ValueError (one line)
    when the counts differ."""
    names = mask_names.split(",") if mask_names else []
    if len(names) != len(mask_tensors):
        raise ValueError(f"{fn}: mask_names names {len(names)} tensors ({mask_names!r}), mask_tensors holds "
                         f"{len(mask_tensors)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{fn}: mask_names names a tensor twice ({mask_names!r})")
    return dict(zip(names, mask_tensors))


def _check_mask_text(fn, mask_mod, mask_names):
    """The predicate and its tensors' names checked and compiled alone by the runtime (ft_check_mask_mod: NVRTC, no
    GPU; once per predicate in the process): a refused or uncompilable predicate raises ValueError in one line."""
    try:
        _lib.check_mask_mod(mask_mod, mask_names.split(",") if mask_names else [])
    except _lib.InvalidArgumentError as e:
        raise ValueError(f"{fn}: {str(e).split(': ', 1)[-1]}") from None


def _op_mask(fn, mask_mod, mask_names, mask_tensors, q, window_size):
    """The masked ops' mask_mod, mask_names and mask_tensors checked (_mask_names, _mask_tensors; the text by the
    runtime at the call): the call's _Mask."""
    mask_mod, names, tensors = _mask_tensors(fn, mask_mod, _mask_names(fn, mask_names, mask_tensors), q, window_size)
    return _Mask(mask_mod, _mask_names(fn, names, tensors))


def _mask_arg(fn, mask_mod, mask_tensors, q, window_size):
    """attention()'s mask_mod and mask_tensors checked (_mask_tensors, then the runtime's check of the text): the
    _Mask to pass on (eager mode)."""
    mask_mod, names, tensors = _mask_tensors(fn, mask_mod, mask_tensors, q, window_size)
    _check_mask_text(fn, mask_mod, names)
    return _Mask(mask_mod, _mask_names(fn, names, tensors))


def _paged_fwd_args(q, k_pages, v_pages, o, lse, block_table, cache_seqlens, max_seqlen_k, causal, scale,
                    layout_code=_lib.FT_PAGES_HND):
    B, H, Sq, d = q.shape
    num_pages, Hk, page_size = _pool_dims(k_pages, layout_code)
    sizes = (B, H, Hk, Sq, d, num_pages, page_size, block_table.shape[1], max_seqlen_k)
    return _lib.pack_paged_forward(sizes, block_table.data_ptr(), cache_seqlens.data_ptr(), _DTYPE_CODES[q.dtype],
                                   1 if causal else 0, scale, _ref(q), _ref(k_pages), _ref(v_pages), _ref(o),
                                   lse.data_ptr(), layout_code)


def _varlen_sizes(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
    return (cu_seqlens_q.numel() - 1, q.shape[1], k.shape[1], q.shape[2], q.shape[0], k.shape[0], max_seqlen_q,
            max_seqlen_k)


def _varlen_fwd_args(q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, mods=NO_MODS):
    return _lib.pack_varlen_forward(_varlen_sizes(q, k, cu_q, max_q, max_k), cu_q.data_ptr(), cu_k.data_ptr(),
                                    _DTYPE_CODES[q.dtype], 1 if causal else 0, scale, _ref3(q), _ref3(k), _ref3(v),
                                    _ref3(o), lse.data_ptr(), _ft_mods(mods))


def _varlen_bwd_args(dout, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, causal, scale, deterministic=False,
                     mods=NO_MODS):
    return _lib.pack_varlen_backward(_varlen_sizes(q, k, cu_q, max_q, max_k), cu_q.data_ptr(), cu_k.data_ptr(),
                                     _DTYPE_CODES[q.dtype], 1 if causal else 0, scale, _ref3(q), _ref3(k), _ref3(v),
                                     _ref3(o), _ref3(dout), lse.data_ptr(), _ref3(dq), _ref3(dk), _ref3(dv),
                                     1 if deterministic else 0, _ft_mods(mods))


# --- the ops ---------------------------------------------------------------------------------------
def _forward_impl(q, k, v, causal, scale, mods=NO_MODS, mask=None):
    B, H, Sq, d = q.shape
    o = torch.empty((B, H, Sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if k.shape[2] == 0:  # no keys: every row fully masked
        return o.zero_(), lse.fill_(math.inf)
    q, k, v = _runtime_layout(q), _runtime_layout(k), _runtime_layout(v)
    with _on(q.device):
        _lib.forward(_fwd_args(q, k, v, o, lse, causal, scale, mods, mask), _stream(q.device))
    return o, lse


@torch.library.custom_op("flashtune_ctypes::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float, deterministic: bool = False, window_left: int = -1, window_right: int = -1,
                  softcap: float = 0.0,
                  alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_fwd"
    q, k, v = _check(q, k, v, fn)
    return _forward_impl(q, k, v, causal, scale,
                         _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), q))


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale, deterministic=False, window_left=-1, window_right=-1, softcap=0.0,
                        alibi_slopes=None):
    B, H, Sq, d = q.shape
    return q.new_empty((B, H, Sq, d)), q.new_empty((B, H, Sq), dtype=torch.float32)


def _backward_impl(dout, q, k, v, o, lse, causal, scale, deterministic=False, mods=NO_MODS, mask=None):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.dtype != q.dtype or dout.device != q.device:
        dout = dout.to(device=q.device, dtype=q.dtype)
    if o.dtype != q.dtype:
        o = o.to(dtype=q.dtype)
    dout, o = _runtime_layout(dout), _runtime_layout(o)  # a broadcast gradient (stride 0) is copied
    q, k, v = _runtime_layout(q), _runtime_layout(k), _runtime_layout(v)
    if lse.dtype != torch.float32 or lse.device != q.device or not lse.is_contiguous():
        lse = lse.to(device=q.device, dtype=torch.float32).contiguous()
    with _on(q.device):
        _lib.backward(_bwd_args(dout, q, k, v, o, lse, dq, dk, dv, causal, scale, deterministic, mods, mask),
                      _stream(q.device))
    return dq, dk, dv


@torch.library.custom_op("flashtune_ctypes::attention_bwd", mutates_args=())
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, causal: bool, scale: float, deterministic: bool = False,
                  window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                  alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_bwd"
    q, k, v = _check(q, k, v, fn)
    return _backward_impl(dout, q, k, v, o, lse, causal, scale, deterministic,
                          _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), q))


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, o, lse, causal, scale, deterministic=False, window_left=-1, window_right=-1,
                        softcap=0.0, alibi_slopes=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, deterministic, *mods = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic, ctx.mods = causal, scale, deterministic, tuple(mods) or NO_MODS


def _backward(ctx, dout, dlse):
    # lse is an output without a gradient (marked non-differentiable): dlse is None.
    q, k, v, o, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(o)
    dq, dk, dv = attention_bwd(dout, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic, *ctx.mods)
    return (dq, dk, dv) + (None,) * (len(ctx.mods) + 3)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Eager mode: the same implementation without the custom op's dispatch, which costs ~0.5 ms of host
    time per call (measured on an H100 under cProfile: torch._library.custom_ops.backend_impl); under
    torch.compile attention() goes through the custom ops, which the compiler can trace. Returns (o, lse),
    lse without a gradient. mask: a mask_mod call's _Mask (through ctypes in either backend; under torch.compile
    the masked ops below), None for every other call."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, deterministic, mods, mask=None):
        o, lse = _forward_impl(q, k, v, causal, scale, mods, mask)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.mods, ctx.mask = causal, scale, deterministic, mods, mask
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient stays None: no zeros_like(lse) per backward
        return o, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(o)
        dq, dk, dv = _backward_impl(dout, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic, ctx.mods,
                                    ctx.mask)
        return dq, dk, dv, None, None, None, None, None


# The masked ops (mask_mod): the predicate's text and its tensors' names (joined by ',': a schema has no list of str)
# as arguments, the tensors as a Tensor[] in the names' order. Registered here alone, in the ctypes namespace, in
# either backend (the extension has no masked op: a mask_mod call runs through ctypes there too); torch.compile traces
# them (attention() calls them while compiling), their fakes give the shapes, and the forward's autograd runs the
# backward op. Each call builds its _Mask from the tensors it is given, their _version then (the runtime's summary
# cache key; attention.h).
@torch.library.custom_op("flashtune_ctypes::attention_mask_fwd", mutates_args=())
def attention_mask_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, mask_mod: str,
                       mask_names: str, mask_tensors: list[torch.Tensor], deterministic: bool = False,
                       window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                       alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_mask_fwd"
    q, k, v = _check(q, k, v, fn)
    mask = _op_mask(fn, mask_mod, mask_names, mask_tensors, q, (window_left, window_right))
    return _forward_impl(q, k, v, causal, scale, _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), q),
                         mask)


@attention_mask_fwd.register_fake
def _attention_mask_fwd_fake(q, k, v, causal, scale, mask_mod, mask_names, mask_tensors, deterministic=False,
                             window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
    B, H, Sq, d = q.shape
    return q.new_empty((B, H, Sq, d)), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("flashtune_ctypes::attention_mask_bwd", mutates_args=())
def attention_mask_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, causal: bool, scale: float, mask_mod: str, mask_names: str,
                       mask_tensors: list[torch.Tensor], deterministic: bool = False, window_left: int = -1,
                       window_right: int = -1, softcap: float = 0.0,
                       alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_mask_bwd"
    q, k, v = _check(q, k, v, fn)
    mask = _op_mask(fn, mask_mod, mask_names, mask_tensors, q, (window_left, window_right))
    return _backward_impl(dout, q, k, v, o, lse, causal, scale, deterministic,
                          _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), q), mask)


@attention_mask_bwd.register_fake
def _attention_mask_bwd_fake(dout, q, k, v, o, lse, causal, scale, mask_mod, mask_names, mask_tensors,
                             deterministic=False, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _mask_setup_context(ctx, inputs, output):
    q, k, v, causal, scale, mask_mod, mask_names, mask_tensors, deterministic, *mods = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, *mask_tensors)
    ctx.causal, ctx.scale, ctx.deterministic, ctx.mods = causal, scale, deterministic, tuple(mods) or NO_MODS
    ctx.mask_mod, ctx.mask_names = mask_mod, mask_names


def _mask_backward(ctx, dout, dlse):
    # lse is an output without a gradient (marked non-differentiable): dlse is None. The mask tensors get none.
    q, k, v, o, lse, *mask_tensors = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(o)
    dq, dk, dv = attention_mask_bwd(dout, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.mask_mod, ctx.mask_names,
                                    mask_tensors, ctx.deterministic, *ctx.mods)
    # One gradient per argument the call passed, the list's as a list (torch.library checks the structure: None would
    # not do for it). Not per input of setup_context: it gets the defaults filled in, while a traced call leaves out
    # the arguments equal to their defaults, and torch before 2.15 checks the gradients against the call's own
    # arguments (needs_input_grad has their structure; 2.15 trims the extra ones itself).
    n_args = len(ctx.needs_input_grad)
    return (dq, dk, dv, None, None, None, None, [None] * len(mask_tensors)) + (None,) * (n_args - 8)


attention_mask_fwd.register_autograd(_mask_backward, setup_context=_mask_setup_context)


# --- packed variable-length batches -----------------------------------------------------------------
def _varlen_forward_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, mods=NO_MODS):
    Tq, H, d = q.shape
    o = torch.empty((Tq, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((H, Tq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if k.shape[0] == 0:  # no keys in any sequence: every row fully masked
        return o.zero_(), lse.fill_(math.inf)
    q, k, v = _runtime_layout(q), _runtime_layout(k), _runtime_layout(v)
    with _on(q.device):
        _lib.varlen_forward(_varlen_fwd_args(q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, mods),
                            _stream(q.device))
    return o, lse


def _varlen_backward_impl(dout, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, deterministic=False,
                          mods=NO_MODS):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.dtype != q.dtype or dout.device != q.device:
        dout = dout.to(device=q.device, dtype=q.dtype)
    if o.dtype != q.dtype:
        o = o.to(dtype=q.dtype)
    dout, o = _runtime_layout(dout), _runtime_layout(o)
    q, k, v = _runtime_layout(q), _runtime_layout(k), _runtime_layout(v)
    if lse.dtype != torch.float32 or lse.device != q.device or not lse.is_contiguous():
        lse = lse.to(device=q.device, dtype=torch.float32).contiguous()
    with _on(q.device):
        _lib.varlen_backward(_varlen_bwd_args(dout, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, causal,
                                              scale, deterministic, mods), _stream(q.device))
    return dq, dk, dv


@torch.library.custom_op("flashtune_ctypes::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                         scale: float, deterministic: bool = False, window_left: int = -1, window_right: int = -1,
                         softcap: float = 0.0,
                         alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_varlen_fwd"
    args = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn)
    mods = _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), args[0], args[3].numel() - 1)
    return _varlen_forward_impl(*args, causal, scale, mods)


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                               deterministic=False, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
    Tq, H, d = q.shape
    return q.new_empty((Tq, H, d)), q.new_empty((H, Tq), dtype=torch.float32)


@torch.library.custom_op("flashtune_ctypes::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                         lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool, scale: float, deterministic: bool = False,
                         window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                         alibi_slopes: Optional[torch.Tensor] = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_varlen_bwd"
    q, k, v, cu_q, cu_k, max_q, max_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                      fn)
    mods = _with_alibi(fn, (window_left, window_right, softcap, alibi_slopes), q, cu_q.numel() - 1)
    return _varlen_backward_impl(dout, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, mods)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                               scale, deterministic=False, window_left=-1, window_right=-1, softcap=0.0,
                               alibi_slopes=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, *mods = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.max_q, ctx.max_k, ctx.causal, ctx.scale, ctx.deterministic = max_q, max_k, causal, scale, deterministic
    ctx.mods = tuple(mods) or NO_MODS


def _varlen_backward(ctx, dout, dlse):
    # lse is an output without a gradient (marked non-differentiable): dlse is None.
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(o)
    dq, dk, dv = attention_varlen_bwd(dout, q, k, v, o, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal, ctx.scale,
                                      ctx.deterministic, *ctx.mods)
    return (dq, dk, dv) + (None,) * (len(ctx.mods) + 7)


attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


class _EagerVarlenAttention(torch.autograd.Function):
    """Eager mode without the custom op's dispatch cost, as _EagerAttention: (o, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, mods):
        o, lse = _varlen_forward_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, mods)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.max_q, ctx.max_k, ctx.causal, ctx.scale, ctx.deterministic = max_q, max_k, causal, scale, deterministic
        ctx.mods = mods
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # as _EagerAttention
        return o, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(o)
        dq, dk, dv = _varlen_backward_impl(dout, q, k, v, o, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal,
                                           ctx.scale, ctx.deterministic, ctx.mods)
        return dq, dk, dv, None, None, None, None, None, None, None, None


# --- paged K/V caches (forward only) ----------------------------------------------------------------------
def _paged_forward_impl(q, k_pages, v_pages, block_table, cache_seqlens, causal, scale, max_seqlen_k,
                        layout_code=_lib.FT_PAGES_HND):
    B, H, Sq, d = q.shape
    o = torch.empty((B, H, Sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    num_pages, _, page_size = _pool_dims(k_pages, layout_code)
    if num_pages == 0 or page_size == 0:  # no pages: no sequence holds a key
        return o.zero_(), lse.fill_(math.inf)
    q = _runtime_layout(q)
    with _on(q.device):
        _lib.paged_forward(_paged_fwd_args(q, k_pages, v_pages, o, lse, block_table, cache_seqlens, max_seqlen_k,
                                           causal, scale, layout_code), _stream(q.device))
    return o, lse


@torch.library.custom_op("flashtune_ctypes::attention_paged_fwd", mutates_args=())
def attention_paged_fwd(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                        cache_seqlens: torch.Tensor, causal: bool, scale: float,
                        max_seqlen_k: int, layout: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    fn = "flashtune_ctypes::attention_paged_fwd"
    if layout not in _POOL_SHAPES:
        raise ValueError(f"{fn}: layout must be 0 (\"hnd\") or 1 (\"nhd\"), got {layout}")
    q, block_table, cache_seqlens, max_seqlen_k = _check_paged(q, k_pages, v_pages, block_table, cache_seqlens,
                                                               max_seqlen_k, fn, layout_code=layout)
    return _paged_forward_impl(q, k_pages, v_pages, block_table, cache_seqlens, causal, scale, max_seqlen_k, layout)


@attention_paged_fwd.register_fake
def _attention_paged_fwd_fake(q, k_pages, v_pages, block_table, cache_seqlens, causal, scale, max_seqlen_k,
                              layout=0):
    B, H, Sq, d = q.shape
    return q.new_empty((B, H, Sq, d)), q.new_empty((B, H, Sq), dtype=torch.float32)


# --- the compiled extension (python/csrc), else the ctypes ops above -----------------------------------------
ENV_TORCH_LIBRARY = "FLASHTUNE_TORCH_LIBRARY"
TORCH_LIBRARY_NAME = "libflashtune_torch.so"


def _load_extension():
    """(True, "extension: <path>") once libflashtune_torch.so is loaded, built for this torch and bound to the
    runtime library that _lib loads; else (False, "ctypes: <why>"). $FLASHTUNE_TORCH_LIBRARY names the file (the
    build tree's tests set it), "0" or "" asks for ctypes; by default it is looked for beside this package. A file
    that is there but does not load, or was built for another torch, warns once (RuntimeWarning)."""
    env = os.environ.get(ENV_TORCH_LIBRARY)
    if env is not None and env.strip() in ("", "0"):
        return False, f"ctypes: ${ENV_TORCH_LIBRARY}={env!r}"
    path = env or os.path.join(os.path.dirname(os.path.abspath(__file__)), TORCH_LIBRARY_NAME)
    if not os.path.isfile(path):
        why = f"ctypes: no {path} (the extension is built where torch imports at build time)"
        if env:
            warnings.warn(f"flashtune.torch: ${ENV_TORCH_LIBRARY}: {why}", RuntimeWarning, stacklevel=3)
        return False, why
    try:
        torch.ops.load_library(path)  # registers torch.ops.flashtune.*
        ext = ctypes.CDLL(path)  # the same handle: its two C functions
        built_with = ext.flashtune_torch_built_with
        built_with.restype = ctypes.c_char_p
        built_with = built_with().decode()
    except (OSError, RuntimeError, AttributeError) as e:
        why = f"ctypes: cannot load {path}: {_lib.one_line(e)}"
        warnings.warn(f"flashtune.torch: {why}", RuntimeWarning, stacklevel=3)
        return False, why
    if built_with != torch.__version__:
        why = f"ctypes: {path} was built against torch {built_with}, this is torch {torch.__version__} (rebuild it)"
        warnings.warn(f"flashtune.torch: {why}", RuntimeWarning, stacklevel=3)
        return False, why
    err = ctypes.create_string_buffer(512)
    if ext.flashtune_torch_bind(_lib.library_path().encode(), err, len(err)) != 0:
        # The runtime library itself is missing: the ctypes path says so (LibraryNotFoundError) at the first call.
        return False, f"ctypes: the extension cannot bind the runtime: {_lib.one_line(err.value.decode())}"
    return True, f"extension: {path}"


_EXT, _BACKEND = _load_extension()


# --- scratch from torch's caching allocator ------------------------------------------------------------------
# Every runtime call's scratch (packed copies of strided inputs, the backward's delta and dq accumulator, split-KV
# partials) comes from torch's caching allocator, on the op's stream: counted in torch.cuda.memory_stats, reused by
# torch, returned by torch.cuda.empty_cache, never held in a pool torch cannot see. The extension installs it in
# C++ when it binds (python/csrc); the ctypes path installs these two, which the runtime calls once per call that
# needs scratch (one allocation, no synchronisation: the runtime frees it after queueing its kernels on the stream).
def _torch_scratch_alloc(nbytes, device, stream):
    return torch.cuda.caching_allocator_alloc(nbytes, device, stream)


def _torch_scratch_free(ptr, nbytes, device, stream):
    torch.cuda.caching_allocator_delete(ptr)


if not _EXT:
    try:
        _lib.set_scratch_allocator(_torch_scratch_alloc, _torch_scratch_free)
    except _lib.LibraryNotFoundError:
        pass  # no runtime library: the first call says so (one line)


def backend():
    """Which backend runs the ops, and why: "extension: <path of libflashtune_torch.so>" or "ctypes: <reason>"."""
    return _BACKEND


if _EXT:
    # The C++ ops, called as OpOverloads (no overload resolution per call); their fake implementations for
    # torch.compile are the fallback's, registered here (the extension's set_python_module names this module).
    _ext_ops = torch.ops.flashtune
    _ext_fwd = _ext_ops.attention_fwd.default
    _ext_fwd_eager = _ext_fwd._op  # the builtin behind the OpOverload: one Python frame less per eager call
    _ext_varlen_fwd = _ext_ops.attention_varlen_fwd.default
    _ext_paged_fwd = _ext_ops.attention_paged_fwd.default
    torch.library.register_fake("flashtune::attention_fwd")(_attention_fwd_fake)
    torch.library.register_fake("flashtune::attention_bwd")(_attention_bwd_fake)
    torch.library.register_fake("flashtune::attention_varlen_fwd")(_attention_varlen_fwd_fake)
    torch.library.register_fake("flashtune::attention_varlen_bwd")(_attention_varlen_bwd_fake)
    torch.library.register_fake("flashtune::attention_paged_fwd")(_attention_paged_fwd_fake)

# A runtime status raised by the extension: "[FT_<STATUS>] <what>: <the runtime's line>".
_STATUS_TAG = re.compile(r"\[(FT_[A-Z_]+)\] ")
_STATUS_CODES = {name: code for code, name in _lib.STATUS_NAMES.items()}


def _ext_error(e, check):
    """The exception to raise for e, raised by an extension op in eager mode: the Python check's own where the
    arguments are wrong (one line, TypeError or ValueError, as the fallback words it), flashtune's exception for a
    runtime status (UnsupportedError, ...), else e."""
    m = _STATUS_TAG.search(str(e))
    if m is None:
        check()
        return e
    status = _STATUS_CODES.get(m.group(1), _lib.FT_CUDA_ERROR)
    err = _lib._ERRORS.get(status, _lib.FlashtuneError)(_lib.one_line(str(e)[m.end():]))
    err.status = status
    return err


def _ext_call(fn, check, op, *args):
    """op(*args) in eager mode, its errors as _ext_error says."""
    try:
        return op(*args)
    except (RuntimeError, ValueError, TypeError) as e:
        raise _ext_error(e, check) from None


# --- the public face -------------------------------------------------------------------------------
def autotune(budget="60s", enabled=True):
    """Tuning at first use for this process (as FLASHTUNE_AUTOTUNE=1, budget FLASHTUNE_AUTOTUNE_BUDGET): the first
    eager attention() call of a bucket (dtype, head dim, mask, grouped or not, the next power of two of the longer
    sequence; for decoding, Sq <= 16, the power of two nearest B x Hk too) that this GPU has no tuned pick for
    (explain()'s source neither "user", "db" nor "device"; for decoding, a pick of another B x Hk class is not one)
    tunes it at the call's shape, forward and backward, within `budget` ("60s", "5m" or seconds), into the user's
    store, in worker processes; later calls and processes read it. Concurrent processes tune a bucket once.
    enabled=False switches it off. See flashtune._autotune for the protocol."""
    _autotune.configure(enabled, budget)


_store_paths = {}


def _user_store(index):
    """The user's store for CUDA device `index` (`flashtune devices --store`), asked once per device."""
    path = _store_paths.get(index)
    if path is None:
        from ._cli import cli_path
        r = subprocess.run([cli_path(), "devices", "--device", str(index), "--store"], capture_output=True, text=True,
                           errors="replace", stdin=subprocess.DEVNULL)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or len(lines) != 1 or not os.path.isabs(lines[0]):
            why = (r.stderr.strip().splitlines() or lines or [f"exit status {r.returncode}"])[-1]
            raise _lib.FlashtuneError(_lib.one_line(f"the user's store for device {index}: {why}"))
        path = _store_paths[index] = lines[0]
    return path


_recorder = None  # flashtune.tune_model: (the attention() calls of one step as dicts, how many to keep)
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _call_dtype(q):
    """The dtype a call's kernels run in: the autocast dtype under torch.autocast("cuda"), else q's."""
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype


def _record_calls(step, limit):
    """Runs step() and returns the attention() calls it made (at most `limit`): batch, heads, heads_k, seq_q,
    seq_k, head_dim, dtype, causal, deterministic and grad (inputs that require a gradient, grad mode on)."""
    global _recorder
    if _recorder is not None:
        raise RuntimeError("flashtune.tune_model: already recording (tune_model is not reentrant)")
    calls = []
    _recorder = (calls, limit)
    try:
        step()
    finally:
        _recorder = None
    return calls


def _record(q, k, v, causal, det):
    if not (torch.is_tensor(q) and torch.is_tensor(k) and torch.is_tensor(v) and q.dim() == 4 and k.dim() == 4):
        return
    calls, limit = _recorder
    dtype = _call_dtype(q)
    if dtype not in _DTYPE_NAMES or len(calls) >= limit:
        return
    B, H, Sq, d = q.shape
    calls.append({"batch": B, "heads": H, "heads_k": k.shape[1], "seq_q": Sq, "seq_k": k.shape[2], "head_dim": d,
                      "dtype": _DTYPE_NAMES[dtype], "causal": bool(causal), "deterministic": bool(det),
                      "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))})


def _first_use(q, k, v, causal, det):
    """Tuning at first use for this call's bucket, when asked for (flashtune._autotune.first_use)."""
    enabled, budget_s = _autotune.settings()  # ValueError: a bad FLASHTUNE_AUTOTUNE(_BUDGET), to the caller
    if not enabled or not torch.is_tensor(q) or not torch.is_tensor(k) or q.dim() != 4 or k.dim() != 4:
        return  # (bad arguments: the op's own checks answer them)
    if not q.is_cuda or torch.cuda.is_current_stream_capturing():
        return
    dtype = _call_dtype(q)
    B, H, Sq, d = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    # a decoding call's bucket holds its batch x kv heads class too, and is tuned at its own batch
    key, shape = _autotune.call_bucket(dtype, B, H, Hk, Sq, Sk, d, causal, det)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()

    def is_tuned():
        return _autotune.is_tuned(key, explain(q, k, v, causal, deterministic=det))

    from ._tune import tune
    _autotune.first_use(key, shape, str(dtype), bool(causal), index, is_tuned, lambda: _user_store(index), tune,
                        budget_s)


def attention(q, k, v, causal=False, scale=None, *, return_lse=False, deterministic=False, window_size=(-1, -1),
              softcap=0.0, alibi_slopes=None, mask_mod=None, mask_tensors=None):
    """softmax(scale * q kᵀ [+ bottom-right causal mask]) v for q [B, H, Sq, d], k and v [B, Hk, Sk, d]
    (Hk = H, or a divisor of H: grouped-query attention, query head h reading kv head h // (H // Hk), as
    torch SDPA with enable_gqa=True; fp16 and bf16).

    Returns o [B, H, Sq, d]; with return_lse=True, (o, lse): lse [B, H, Sq] fp32, the natural log of each row's
    softmax denominator of the scaled scores (FlashAttention's softmax_lse; +inf for a row that sees no key),
    without a gradient (gradients flow through o; backpropagating through lse raises).
    deterministic=True: the backward runs only kernels whose dq, dk, dv are bitwise equal from run to run on the
    same inputs (the tables' deterministic picks; explain(..., deterministic=True) names them), usually slower.
    window_size=(left, right) (FlashAttention's; -1 unbounded): query i sees key j iff
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (bottom-right aligned; with causal the right edge is the
    diagonal); softcap=c > 0: the scaled scores s become c * tanh(s / c) before the softmax (Gemma-2). Both run in
    the forward on every GPU (fa3_wgmma on sm_90, fa2_mma elsewhere; fp16 and bf16, blocks outside the window
    skipped) and the backward up to d 128 (fa3_wgmma_bwd on sm_90 at d 64, 96, 128, fa2_mma_bwd elsewhere); a
    call no kernel runs with them raises flashtune.UnsupportedError naming what is missing.
    alibi_slopes (FlashAttention's; fp32 [H] or [B, H] on q's device): head h of sequence b adds
    -slope |i + Sk - Sq - j| to its scaled scores (BLOOM, MPT), forward and backward, in the same families.
    mask_mod (a str): a mask predicate, the body of `bool mask(int b, int h, int q_idx, int kv_idx)` (statements with
    a return, or one expression), true where query q_idx of head h in batch entry b sees key kv_idx (positions in
    the sequence), ANDed with causal; mask_tensors: a dict name -> 1-D torch.int32 tensor on q's device that the
    predicate reads as name[i] (0 outside it), e.g. mask_mod="doc[q_idx] == doc[kv_idx]", mask_tensors={"doc": ids}.
    Compiled into the Hopper kernels (fa3_wgmma, fa3_wgmma_bwd; dense, not with window_size or deterministic),
    cached by its hash; a predicate that is refused or does not compile raises ValueError in one line. Runs through
    ctypes in either backend; under torch.compile through the ops torch.ops.flashtune_ctypes.attention_mask_fwd and
    attention_mask_bwd (no graph break). docs/kernels.md, "mask_mod".
    Differentiable; fp32, fp16 and bf16 (under torch.autocast("cuda"): the autocast dtype). Raises
    TypeError/ValueError on bad arguments, flashtune.UnsupportedError (a ValueError) for a head dim or
    dtype the runtime has no kernel for on this GPU, flashtune.FlashtuneError for other runtime failures."""
    # Every line here runs on every call (its host time shows where the GPU waits: experiments/probes/host_time.py):
    # the usual arguments are recognised by identity, the checks' functions run only for the others.
    fn = "flashtune.torch.attention"
    if return_lse is not True and return_lse is not False:
        _lib.flag(fn, "return_lse", return_lse)  # raises: a bool only
    if deterministic is not True and deterministic is not False:
        _lib.flag(fn, "deterministic", deterministic)
    det = deterministic  # to the runtime's backward args (python/csrc: BackwardOptions)
    if mask_mod is not None or mask_tensors is not None:  # the predicate's own path (_EagerAttention with a mask)
        if torch.compiler.is_compiling():  # the masked ops, which the compiler traces (the text: at the call)
            mask_mod, names, tensors = _mask_tensors(fn, mask_mod, mask_tensors, q, window_size)
            mods = _with_alibi(fn, _mods(fn, window_size, softcap, alibi_slopes), q)
            q, k, v = _check(q, k, v, fn, autocast=True)
            o, lse = attention_mask_fwd(q, k, v, bool(causal), _scale(scale), mask_mod, names, tensors, det, *mods)
            return (o, lse) if return_lse else o
        mask = _mask_arg(fn, mask_mod, mask_tensors, q, window_size)
        mods = _with_alibi(fn, _mods(fn, window_size, softcap, alibi_slopes), q)
        q, k, v = _check(q, k, v, fn, autocast=True)
        o, lse = _EagerAttention.apply(q, k, v, bool(causal), _scale(scale), det, mods, mask)
        return (o, lse) if return_lse else o
    if window_size == _NO_WINDOW and softcap == 0 and alibi_slopes is None:
        mods = NO_MODS
    else:
        mods = _with_alibi(fn, _mods(fn, window_size, softcap, alibi_slopes), q)
    if causal is not True and causal is not False:
        causal = bool(causal)
    if _autotune.requested() and not torch.compiler.is_compiling():
        _first_use(q, k, v, causal, det)
    if _recorder is not None:
        _record(q, k, v, causal, det)
    if _EXT:  # the checks run in C++; in Python only where they cost nothing per call (tracing) or cast (autocast)
        s = 0.0 if scale is None else _scale(scale)
        if torch.compiler.is_compiling():
            q, k, v = _check(q, k, v, fn, autocast=True)
            o, lse = _ext_fwd(q, k, v, causal, s, det, *mods)
        else:
            if torch.is_autocast_enabled("cuda"):
                q, k, v = _autocast_cast(q, k, v)
            try:
                o, lse = _ext_fwd_eager(q, k, v, causal, s, det, *mods)
            except (RuntimeError, ValueError, TypeError) as e:
                raise _ext_error(e, lambda: _check(q, k, v, fn)) from None
        return (o, lse) if return_lse else o
    q, k, v = _check(q, k, v, fn, autocast=True)
    if torch.compiler.is_compiling():
        o, lse = attention_fwd(q, k, v, bool(causal), _scale(scale), det, *mods)
    else:
        o, lse = _EagerAttention.apply(q, k, v, bool(causal), _scale(scale), det, mods, None)
    return (o, lse) if return_lse else o


class FlashAttention(torch.nn.Module):
    """attn = FlashAttention(head_dim=64, causal=True); out = attn(q, k, v) with q [B, H, S, head_dim]."""

    def __init__(self, head_dim=None, causal=False, scale=None):
        super().__init__()
        self.head_dim = head_dim
        self.causal = bool(causal)
        self.scale = scale

    def forward(self, q, k, v, causal=None):
        if self.head_dim is not None and isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[-1] != self.head_dim:
            raise ValueError(f"FlashAttention(head_dim={self.head_dim}) got q with head dim {q.shape[-1]}")
        return attention(q, k, v, causal=self.causal if causal is None else bool(causal), scale=self.scale)

    def extra_repr(self):
        return f"head_dim={self.head_dim}, causal={self.causal}" + (f", scale={self.scale}" if self.scale else "")


def explain(q, k, v, causal=False, deterministic=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
            mask_mod=None, mask_tensors=None):
    """Which kernels attention(q, k, v, causal, deterministic=..., ...) runs and why: a dict with family, config,
    source ("user", "db", "device", "arch", "default"), cache ("memory", "disk", "jit", "aot"), device and arch of
    the forward, its decode bucket ("bucket": "batch x kv heads 512 (of 8, 64, 512), Sk <= 4096" where a decoding
    family's tabled or stored pick runs, else ""), and the same for the backward under "backward" ({"error": ...}
    where it has none). The modifications (window_size, softcap, alibi_slopes, mask_mod with mask_tensors) as
    attention's, checked the same way: a window's forward reads another bucket than the plain call, and a mask_mod
    call runs its pick with what the mask refuses turned off (MULTICAST, DQ_TURNS; and the backward's BLOCK_M 80 or 96 as
    64 with any modification), which the config says."""
    fn = "flashtune.torch.explain"
    det = _lib.flag(fn, "deterministic", deterministic)
    mods = _mods(fn, window_size, softcap, alibi_slopes)
    mask = None if mask_mod is None and mask_tensors is None else _mask_arg(fn, mask_mod, mask_tensors, q, window_size)
    q, k, v = _check(q, k, v, fn, autocast=True)
    mods = _with_alibi(fn, mods, q)
    B, H, Sq, d = q.shape
    q, k, v = (_runtime_layout(t) for t in (q, k, v))
    o = torch.empty((B, H, Sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    with _on(q.device):
        args = _fwd_args(q, k, v, o, lse, bool(causal), 0.0, mods, mask)
        out = _lib.explain_forward(args)
        out["bucket"] = _lib.explain_bucket(_lib.explain_forward_text(args))
        dq, dk, dv = torch.empty_like(o), torch.empty_like(k), torch.empty_like(v)
        try:
            out["backward"] = _lib.explain_backward(_bwd_args(o, q, k, v, o, lse, dq, dk, dv, bool(causal), 0.0, det,
                                                              mods, mask))
        except _lib.FlashtuneError as e:
            out["backward"] = {"error": str(e)}
    return out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None, *,
                     return_lse=False, deterministic=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    """Attention over a packed batch of sequences of different lengths, as flash_attn_varlen_func: q
    [total_q, H, d], k and v [total_k, Hk, d] (Hk dividing H: grouped-query attention), sequence b owning
    query tokens cu_seqlens_q[b]:cu_seqlens_q[b+1] and keys cu_seqlens_k[b]:cu_seqlens_k[b+1] (int32
    tensors of batch + 1 offsets on q's device, from 0, non-decreasing, ending at total_q and total_k);
    max_seqlen_q/k (ints) at least the longest lengths. causal is per sequence, bottom-right aligned.
    Returns o [total_q, H, d]; with return_lse=True, (o, lse): lse [H, total_q] fp32, natural log
    (flash_attn_varlen_func's softmax_lse layout), without a gradient. Differentiable in q, k, v (through o);
    deterministic=True, window_size and softcap as attention's (the window aligned to each sequence's lengths);
    alibi_slopes ([H] or [batch, H] fp32) as attention's, forward only (the packed backward has no ALiBi form: with
    inputs that require grad while grad mode is on it raises ValueError).
    fp16 and bf16 (under torch.autocast("cuda"): the autocast dtype).

    Raises TypeError/ValueError on bad arguments (shapes, dtypes, devices, offsets' dtype and count, totals
    above batch x max_seqlen); the offsets' values live on the GPU and are trusted, as flash-attn trusts them:
    wrong ones read or write outside the tensors."""
    fn = "flashtune.torch.attention_varlen"
    return_lse = _lib.flag(fn, "return_lse", return_lse)
    det = _lib.flag(fn, "deterministic", deterministic)
    mods = _mods(fn, window_size, softcap, alibi_slopes)
    q, k, v, cu_q, cu_k, max_q, max_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                      fn, autocast=True)
    if alibi_slopes is not None:
        mods = _with_alibi(fn, mods, q, cu_q.numel() - 1)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError(f"{fn}: alibi_slopes has no backward for packed batches yet (the dense attention() has "
                             f"one): call it under torch.no_grad(), or pass tensors that do not require grad")
    args = (q, k, v, cu_q, cu_k, max_q, max_k, bool(causal), _scale(scale), det)
    if _EXT:
        if torch.compiler.is_compiling():
            o, lse = _ext_varlen_fwd(*args, *mods)
        else:
            o, lse = _ext_call(fn, lambda: None, _ext_varlen_fwd, *args, *mods)
    elif torch.compiler.is_compiling():
        o, lse = attention_varlen_fwd(*args, *mods)
    else:
        o, lse = _EagerVarlenAttention.apply(*args, mods)
    return (o, lse) if return_lse else o


def attention_paged(q, k_pages, v_pages, block_table, cache_seqlens, causal=False, scale=None, max_seqlen_k=None, *,
                    layout="hnd"):
    """Decoding attention against a paged K/V cache (vLLM's PagedAttention; FlashAttention's
    flash_attn_with_kvcache(block_table=...)): q [B, H, Sq, d] (torch SDPA's layout, any strides; Sq 1 to 16),
    k_pages and v_pages contiguous, layout="hnd": [num_pages, Hk, page_size, d] (each page holds page_size
    consecutive keys of every kv head, head-major), layout="nhd": [num_pages, page_size, Hk, d] (FlashAttention's
    k_cache and vLLM's blocks; read in place as well, by the same configs; Hk dividing H: grouped-query attention),
    block_table int32 [B, max_pages]
    (sequence b's logical page j is physical page block_table[b, j]) and cache_seqlens int32 [B] (sequence b
    holds cache_seqlens[b] keys), all on q's GPU. causal is bottom-right aligned to each sequence's own length;
    a sequence without keys gives O = 0. max_seqlen_k (an int, optional) bounds the cache lengths for the
    config lookup only. Returns o [B, H, Sq, d], contiguous. fp16 and bf16 (under torch.autocast("cuda"), q in
    the autocast dtype; the cache is never cast).

    Forward only: decoding is inference. Inputs that require grad while grad mode is on raise RuntimeError
    (call it under torch.no_grad() or torch.inference_mode()). Raises TypeError/ValueError on bad arguments,
    flashtune.UnsupportedError (a ValueError) for Sq > 16, a head dim or a page size no kernel reads (pages must
    be a multiple of some BLOCK_N: 32 keys at least). The tables' values live on the GPU and are trusted: a
    block table entry outside the pools or a cache length past max_pages x page_size reads outside them."""
    fn = "flashtune.torch.attention_paged"
    code = _lib.page_layout_code(fn, layout)
    q, block_table, cache_seqlens, max_k = _check_paged(q, k_pages, v_pages, block_table, cache_seqlens, max_seqlen_k,
                                                        fn, autocast=True, layout_code=code)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_pages, v_pages)):
        raise RuntimeError(f"{fn} is forward only (decoding has no backward here): call it under torch.no_grad() or "
                           f"torch.inference_mode(), or pass tensors that do not require grad")
    args = (q, k_pages, v_pages, block_table, cache_seqlens, bool(causal), _scale(scale), max_k, code)
    if _EXT:
        if torch.compiler.is_compiling():
            return _ext_paged_fwd(*args)[0]
        return _ext_call(fn, lambda: None, _ext_paged_fwd, *args)[0]
    if torch.compiler.is_compiling():
        return attention_paged_fwd(*args)[0]
    return _paged_forward_impl(*args)[0]


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=False,
                           scale=None, max_seqlen_k=None, layout="hnd"):
    """Decoding against a K/V cache with the step's new keys and values appended first, in one call (FlashAttention's
    flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=..., block_table=...)): q [B, H, Sq, d]
    (Sq 1 to 16); the cache either paged, k_cache and v_cache [num_pages, Hk, page_size, d] (layout="nhd":
    [num_pages, page_size, Hk, d], FlashAttention's and vLLM's) with block_table int32 [B, max_pages] (as
    attention_paged), or, block_table None, contiguous [B, Hk, S_max, d] (layout="nhd": [B, S_max, Hk, d],
    FlashAttention's k_cache without a block table) (sequence b's keys in k_cache[b]: read as one page of S_max
    keys per sequence, so S_max must be a page size attention_paged reads); cache_seqlens int32 [B], the keys each
    sequence holds before this call.
    k, v (both or neither): [B, Hk, S_new, d] (q's SDPA layout, in either cache layout) in the cache's dtype, S_new
    at most a page: written into the cache at positions cache_seqlens[b] .. cache_seqlens[b] + S_new - 1 of
    sequence b (in place, through the block table; nhd: k_cache[page, slot, :, :]),
    then every query row attends to the cache_seqlens[b] + S_new keys (causal: bottom-right aligned to that length,
    so with Sq = S_new new tokens each sees the cache and the new tokens up to itself). cache_seqlens is not changed:
    the caller advances it, as with FlashAttention. Returns o [B, H, Sq, d], contiguous.

    Forward only (decoding is inference), under torch.no_grad() or torch.inference_mode(). The cache's positions
    are device values and trusted as the tables are: max_seqlen_k, when given, bounds cache_seqlens + S_new and is
    checked against the cache's capacity (max_pages x page_size, or S_max); a position past the capacity is not
    written (its page index is clamped to the table, so no index leaves the tensors), and its keys are not what the
    attention reads. Raises TypeError/ValueError on bad arguments, one line each, and what attention_paged raises."""
    fn = "flashtune.torch.attention_with_kvcache"
    code = _lib.page_layout_code(fn, layout)
    nhd = code == _lib.FT_PAGES_NHD
    if (k is None) != (v is None):
        raise ValueError(f"{fn}: give both k and v (the new tokens) or neither")
    if block_table is None:
        if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
            raise ValueError(f"{fn}: without block_table, k_cache must be a 4-D contiguous cache "
                             f"{'[batch, max_seqlen, heads_k, head_dim]' if nhd else '[batch, heads_k, max_seqlen, head_dim]'}"
                             f" (layout {layout!r})")
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or k_cache.shape[0] != q.shape[0]:
            raise ValueError(f"{fn}: without block_table, the cache holds one sequence per row of q's batch: q "
                             f"{tuple(getattr(q, 'shape', ()))}, k_cache {tuple(k_cache.shape)}")
        block_table = torch.arange(k_cache.shape[0], dtype=torch.int32, device=k_cache.device)[:, None]
    if k is not None:
        for n, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{fn}: {n} must be a 4-D tensor [batch, heads_k, new_tokens, head_dim]")
            if t.dtype != k_cache.dtype or t.device != k_cache.device:
                raise TypeError(f"{fn}: {n} is {t.dtype} on {t.device}, the cache {k_cache.dtype} on {k_cache.device}; "
                                f"the new tokens are written into it as they are")
        if k.shape != v.shape:
            raise ValueError(f"{fn}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
        if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
            raise ValueError(f"{fn}: k_cache must be 4-D {_POOL_SHAPES[code][0]} (layout {layout!r})")
        if k_cache.shape != v_cache.shape:
            raise ValueError(f"{fn}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
        _, cache_heads, page = _pool_dims(k_cache, code)
        B, Hk, s_new, d = k.shape
        if (B, Hk, d) != (block_table.shape[0], cache_heads, k_cache.shape[3]):
            raise ValueError(f"{fn}: k {tuple(k.shape)} [batch, heads_k, new_tokens, head_dim] does not match the "
                             f"cache's heads and head dim {(cache_heads, k_cache.shape[3])} (k_cache "
                             f"{_POOL_SHAPES[code][0]}, layout {layout!r}) and the batch {block_table.shape[0]}")
        if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != B:
            raise ValueError(f"{fn}: cache_seqlens must be a 1-D torch.int32 tensor [batch]")
        capacity = block_table.shape[1] * page
        if s_new > page:
            raise ValueError(f"{fn}: {s_new} new tokens in one call, more than a page ({page} keys); append them in "
                             f"calls of at most a page")
        if max_seqlen_k is not None and not isinstance(max_seqlen_k, bool) and isinstance(max_seqlen_k, int) \
                and max_seqlen_k > capacity:
            raise ValueError(f"{fn}: max_seqlen_k = {max_seqlen_k} is past the cache's capacity {capacity}")
        if s_new:
            # Positions on the device, no host sync (a CUDA graph may hold the call): token i of sequence b goes to
            # row pos % page_size of page block_table[b, pos // page_size], pos = cache_seqlens[b] + i. A position past
            # the capacity writes its row's own value back (clamped into the table: no index leaves the tensors; it
            # cannot meet a written row of its sequence: those are fewer than S_new <= page_size positions away).
            with torch.no_grad():
                pos = cache_seqlens.to(torch.long).clamp(min=0)[:, None] + torch.arange(s_new, device=k.device)[None, :]
                inside = (pos < capacity)[..., None, None]
                pages = block_table.to(torch.long).gather(1, (pos // page).clamp(max=block_table.shape[1] - 1))
                slot = pos % page
                for cache, new in ((k_cache, k), (v_cache, v)):
                    # [B, S_new, Hk, d] either way: hnd's index (page, :, slot) puts its two index dims first
                    rows = cache[pages, slot] if nhd else cache[pages, :, slot]
                    rows = torch.where(inside, new.transpose(1, 2), rows)
                    if nhd:
                        cache[pages, slot] = rows
                    else:
                        cache[pages, :, slot] = rows
            cache_seqlens = cache_seqlens + s_new
    return attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, causal=causal, scale=scale,
                           max_seqlen_k=max_seqlen_k, layout=layout)


def explain_paged(q, k_pages, v_pages, block_table, cache_seqlens, causal=False, max_seqlen_k=None, *, layout="hnd"):
    """explain() for attention_paged(): family, config, source, cache, device and arch of the forward, the decode
    bucket ("bucket", as explain()'s) and the runtime's note ("note": why a tuned config did not suit the page size,
    or that the dense decoding pick or the default's nearest config ran; "" when the tables' paged entry runs) from
    its explain line. layout as attention_paged's (both layouts take the same config; "nhd" runs its token-major
    kernels)."""
    fn = "flashtune.torch.explain_paged"
    code = _lib.page_layout_code(fn, layout)
    q, block_table, cache_seqlens, max_k = _check_paged(q, k_pages, v_pages, block_table, cache_seqlens, max_seqlen_k,
                                                        fn, autocast=True, layout_code=code)
    B, H, Sq, d = q.shape
    q = _runtime_layout(q)
    o = torch.empty((B, H, Sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    with _on(q.device):
        args = _paged_fwd_args(q, k_pages, v_pages, o, lse, block_table, cache_seqlens, max_k, bool(causal), 0.0, code)
        out = _lib.explain_paged_forward(args)
        line = _lib.explain_paged_forward_text(args)
    out["note"] = line.split("; ", 1)[1] if "; " in line else ""
    out["bucket"] = _lib.explain_bucket(line)
    return out


def explain_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, deterministic=False,
                   window_size=(-1, -1), softcap=0.0):
    """explain() for attention_varlen(): the forward's family, config, source, cache, device and arch (the
    families' packed forms), and the backward's under "backward"."""
    det = _lib.flag("flashtune.torch.explain_varlen", "deterministic", deterministic)
    mods = _mods("flashtune.torch.explain_varlen", window_size, softcap)
    q, k, v, cu_q, cu_k, max_q, max_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                      "flashtune.torch.explain_varlen", autocast=True)
    Tq, H, d = q.shape
    q, k, v = (_runtime_layout(t) for t in (q, k, v))
    o = torch.empty((Tq, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((H, Tq), dtype=torch.float32, device=q.device)
    with _on(q.device):
        out = _lib.explain_varlen_forward(_varlen_fwd_args(q, k, v, o, lse, cu_q, cu_k, max_q, max_k, bool(causal), 0.0,
                                                           mods))
        dq, dk, dv = torch.empty_like(o), torch.empty_like(k), torch.empty_like(v)
        try:
            out["backward"] = _lib.explain_varlen_backward(
                _varlen_bwd_args(o, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, bool(causal), 0.0, det,
                                 mods))
        except _lib.FlashtuneError as e:
            out["backward"] = {"error": str(e)}
    return out
