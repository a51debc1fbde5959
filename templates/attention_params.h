// The one kernel argument every attention kernel takes. Plain C++ so that the
// host (tuner worker, consumer builds) and the device (NVRTC, nvcc) share it.
#pragma once

#include "mask_mod.h"
#include "traits_common.h"

namespace flashtune {

// Layout: every tensor is contiguous (batch, heads, seq, head_dim), the layout of
// torch.nn.functional.scaled_dot_product_attention. head_dim and the causal flag are
// template parameters of the kernel traits, not fields here.
// Grouped-query attention: K, V (and dK, dV) have heads_k heads; query head h reads kv head
// h / (heads / heads_k). heads_k = 0 means heads_k = heads (multi-head), so that a caller that
// leaves the field zero keeps the old meaning.
// Packed variable-length batches: VarlenParams below.
struct AttnFwdParams {
  const void* q;     // (B, H, Sq, d), element type per the kernel's dtype
  const void* k;     // (B, Hk, Sk, d)
  const void* v;     // (B, Hk, Sk, d)
  void* o;           // (B, H, Sq, d)
  float* lse;        // (B, H, Sq) natural-log log-sum-exp; +inf for a fully masked row
  float* workspace;  // family-specific scratch (naive: the score matrix), may be null
  int batch;
  int heads;
  int seq_q;
  int seq_k;
  float scale;       // softmax scale, 1/sqrt(d) unless the caller chose another
  float scale_log2;  // scale * log2(e): scores in the exp2 domain
  int heads_k;       // kv heads (0: heads)
};

// The backward's argument: the forward's tensors and results, the incoming gradient, and the
// three gradients out. Every kernel of a backward family (preprocess, dK/dV, dQ) takes it.
struct AttnBwdParams {
  const void* q;       // (B, H, Sq, d)
  const void* k;       // (B, Hk, Sk, d)
  const void* v;       // (B, Hk, Sk, d)
  const void* o;       // (B, H, Sq, d): the forward's output
  const float* lse;    // (B, H, Sq): the forward's natural-log LSE, +inf for a fully masked row
  const void* dout;    // (B, H, Sq, d): dL/dO
  void* dq;            // (B, H, Sq, d)
  void* dk;            // (B, Hk, Sk, d): summed over the query heads of the group
  void* dv;            // (B, Hk, Sk, d)
  float* delta;        // (B, H, Sq) scratch: D = rowsum(dO * O), written by the preprocess kernel
  float* dq_accum;     // (B, H, Sq, d) fp32 scratch for atomically accumulated dQ (may be unused)
  int batch;
  int heads;
  int seq_q;
  int seq_k;
  float scale;         // softmax scale
  float scale_log2;    // scale * log2(e)
  void* workspace;     // family-specific scratch (fa2_wgmma_bwd LOAD 1: tile images of Q, dO, lse, delta), may be null
  int heads_k;         // kv heads (0: heads)
};

// Packed variable-length batches (FlashAttention's varlen layout): the argument of a family's packed
// form (`kernel<Traits, true>`) is the dense struct followed by the offsets, so that its leading bytes
// are exactly AttnFwdParams / AttnBwdParams (a caller that fills those and zeroes the rest keeps their
// meaning) and the dense kernels' argument is unchanged: growing AttnBwdParams itself by these 16 bytes
// moved ptxas's register allocation in every dense fa2_mma_bwd kernel (sm_90: 4 of the 300 compiled
// variants of configs/spaces/fa2_mma_bwd.json then spilled), with not one instruction of theirs changed.
// cu_seqlens_q and cu_seqlens_k hold batch + 1 int32 offsets from 0: sequence b owns query tokens
// [cu_seqlens_q[b], cu_seqlens_q[b+1]) and keys [cu_seqlens_k[b], cu_seqlens_k[b+1]); Q, O, dO, dQ (and
// dq_accum) are (total_q, H, d), K, V, dK, dV (total_k, Hk, d), lse and delta (H, total_q); batch is the
// number of sequences and seq_q, seq_k the longest lengths (the grid's).
template <class Dense>
struct VarlenParams : Dense {
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
};
// The argument type of a kernel's dense (false) or packed (true) form.
template <bool VARLEN, class Dense>
struct ParamsOf {
  using type = Dense;
};
template <class Dense>
struct ParamsOf<true, Dense> {
  using type = VarlenParams<Dense>;
};

// Paged K/V caches (vLLM's PagedAttention; FlashAttention's flash_attn_with_kvcache(block_table=...)), for a
// decoding family's paged form (`kernel<Traits, true>`): the dense struct followed by the block table, for the
// same reason as VarlenParams (the dense argument, and so the dense kernels' code, unchanged). k and v point at
// pools of pages in one of two layouts (PageLayout below; the argument is the same for both):
//   head-major (hnd, `kernel<Traits, true>`): (num_pages, heads_k, page_size, d): one page holds page_size
//     consecutive keys of every kv head, each head's a contiguous (page_size, d) matrix, so a block of keys inside
//     a page is read exactly as a dense head's rows are (rows d apart: the loader's per-chunk offsets immediates);
//   token-major (nhd, `kernel<PagedNhdTraits<Traits>, true>`): (num_pages, page_size, heads_k, d), FlashAttention's
//     k_cache and vLLM's: a key's kv heads adjacent, so a kv head's keys are heads_k*d elements apart (the loader
//     steps its rows by that runtime stride, the chunks of a row still immediates).
// Sequence b's logical page j (keys [j*page_size, (j+1)*page_size)) is physical page
// block_table[b*max_pages + j]; it holds cache_seqlens[b] <= seq_k keys (seq_k: the longest, the grid's).
// Q, O and LSE are dense (B, H, Sq, ...); causal is bottom-right aligned to each sequence's own length.
template <class Dense>
struct PagedParams : Dense {
  const int* block_table;    // (batch, max_pages) int32; entries past a sequence's pages are never read
  const int* cache_seqlens;  // (batch) int32
  int page_size;             // keys per page (the family says which it takes: decode_splitkv, multiples of BLOCK_N)
  int max_pages;             // the block table's row stride
};
// The argument type of a kernel's dense (false) or paged (true) form.
template <bool PAGED, class Dense>
struct PagedParamsOf {
  using type = Dense;
};
template <class Dense>
struct PagedParamsOf<true, Dense> {
  using type = PagedParams<Dense>;
};
// Element offset of key `key_in_page` of kv head hk in physical page `page` of a (num_pages, heads_k, page_size,
// d) pool. Plain C++: the worker fills the pools and the tests emulate the kernel with it.
FT_HD inline long long paged_key_offset(int page, int heads_k, int page_size, int hk, int key_in_page, int d) {
  return ((static_cast<long long>(page) * heads_k + hk) * page_size + key_in_page) * d;
}
// The same key in a token-major (num_pages, page_size, heads_k, d) pool.
FT_HD inline long long nhd_paged_key_offset(int page, int heads_k, int page_size, int hk, int key_in_page, int d) {
  return ((static_cast<long long>(page) * page_size + key_in_page) * heads_k + hk) * d;
}

// A pool's layout: part of a paged problem's identity (core/problem.hpp's Paged) and of the runtime's paged call
// (ft_paged_forward_args.layout, whose values these are).
enum class PageLayout : int {
  hnd = 0,  // (num_pages, heads_k, page_size, d): head-major pages
  nhd = 1,  // (num_pages, page_size, heads_k, d): token-major pages (FlashAttention's, vLLM's)
};
// Either layout's offset (host code: the worker's pools, the tests' emulation).
FT_HD inline long long paged_key_offset(PageLayout layout, int page, int heads_k, int page_size, int hk, int key_in_page,
                                        int d) {
  return layout == PageLayout::nhd ? nhd_paged_key_offset(page, heads_k, page_size, hk, key_in_page, d)
                                   : paged_key_offset(page, heads_k, page_size, hk, key_in_page, d);
}
// The token-major form of a family's paged kernels: the traits wrapped (as AttnModTraits wraps them for the score
// modifications), so that the head-major kernels keep their names and code. PagesOf<T>::nhd() reads it (false for
// plain traits, which do not declare it). A function, not a static data member: NVRTC emitted such a member as a
// variable of the cubin (and its address into the constant bank) in the head-major kernels too.
template <class Base>
struct PagedNhdTraits : Base {
  static constexpr bool kPagesNhd = true;
};
template <class T, class = void>
struct PagesOf {
  FT_HD static constexpr bool nhd() { return false; }
};
template <class T>
struct PagesOf<T, decltype(void(T::kPagesNhd))> {
  FT_HD static constexpr bool nhd() { return T::kPagesNhd; }
};

// Score modifications (issue 32): the argument of a kernel instantiated on AttnModTraits (traits_common.h) is its
// plain argument (dense, packed or paged) followed by AttnMods, for the same reason as VarlenParams: the plain
// kernels' argument, and so their code, unchanged. Window edges are bottom-right aligned like causal: query i sees
// key j iff j >= i + (seq_k - seq_q) - window_left and j <= i + (seq_k - seq_q) + window_right (per sequence's
// lengths when packed), -1 unbounded. The softcap's constants are the host's (one rounding each, the same in every
// launcher): the kernel computes t = tanh(s_raw * softcap_scale) and uses t * softcap_log2 as the exp2-domain score.
// ALiBi (FlashAttention's alibi_slopes): the scaled (and capped) score of query i and key j of query head h in
// batch b (sequence b when packed) gets -slope |i + seq_k - seq_q - j|, slope = alibi_slopes[b * alibi_batch_stride
// + h] (fp32, the caller's device array: [H] with stride 0 or [B, H] with stride H). The kernel adds
// -slope * alibi_unit * |...| to the score in the units its exp2-domain factor multiplies (the raw dot product, or t
// with a softcap), as FlashAttention's kernels add slope / softmax_scale to the raw score: alibi_unit is 1 / scale,
// or 1 / c with a softcap (the host's rounding, once).
struct AttnMods {
  int window_left;      // -1: unbounded
  int window_right;     // -1: unbounded (a causal kernel's right edge is the diagonal whatever this says)
  float softcap;        // c; 0: off (then the two below are unused)
  float softcap_scale;  // scale / c: the raw dot product's factor inside tanh
  float softcap_log2;   // c * log2(e): the capped score's factor in the exp2 domain
  float alibi_unit;     // ALIBI: 1 / scale, or 1 / c with a softcap (0 without slopes)
  const float* alibi_slopes;  // ALIBI: fp32 slopes on the device, nullptr: none
  long long alibi_batch_stride;  // ALIBI: 0 (slopes [H]) or H (slopes [B, H])
};
FT_HD inline AttnMods make_attn_mods(int window_left, int window_right, double softcap, double scale,
                                     const float* alibi_slopes = nullptr, long long alibi_batch_stride = 0) {
  const double log2e = 1.4426950408889634074;
  return AttnMods{window_left,
                  window_right,
                  static_cast<float>(softcap),
                  softcap > 0 ? static_cast<float>(scale / softcap) : 0.f,
                  softcap > 0 ? static_cast<float>(softcap * log2e) : 0.f,
                  alibi_slopes ? static_cast<float>(softcap > 0 ? 1.0 / softcap : 1.0 / scale) : 0.f,
                  alibi_slopes,
                  alibi_batch_stride};
}
template <class Plain>
struct ModParams : Plain {
  AttnMods mods;
};
// A kernel with a mask_mod (AttnModTraits' MASK, mask_mod.h): ModParams, then the predicate's tensors and its block
// summary's lists, so that every other kernel's argument (plain or modified) is what it was.
template <class Plain>
struct MaskModParams : ModParams<Plain> {
  MaskModArgs mask;
};
// The argument type of a kernel with modifications (MODS true) or without; MASK: with a mask_mod too.
template <bool MODS, class Plain, bool MASK = false>
struct ModParamsOf {
  using type = Plain;
};
template <class Plain>
struct ModParamsOf<true, Plain, false> {
  using type = ModParams<Plain>;
};
template <class Plain>
struct ModParamsOf<true, Plain, true> {
  using type = MaskModParams<Plain>;
};

// TMA tensor maps (CUtensorMap: 128 opaque bytes, 128-byte aligned as cuda.h declares it), encoded on the host from what a
// family declares (Family::tensor_maps) and passed as the kernel's second, __grid_constant__
// parameter. Each describes one tensor as 4-D (head_dim, seq, heads, batch) with a box of
// (columns, rows, 1, 1), in the order the family lists them.
struct alignas(128) TmaDescriptor {
  unsigned long long bits[16];
};
constexpr int kMaxTensorMaps = 4;
struct AttnTensorMaps {
  TmaDescriptor map[kMaxTensorMaps];
};

// Query heads per kv head.
template <class Params>
FT_HD inline int query_group(const Params& p) {
  return p.heads_k > 0 ? p.heads / p.heads_k : 1;
}

// Where sequence b of a packed variable-length batch lives (the varlen form of a kernel): its lengths,
// and element offsets and row strides in the token-major tensors. Plain C++: the host tests it.
struct VarlenSeq {
  int seq_q, seq_k;        // this sequence's lengths (either may be 0)
  long long q_tok0, k_tok0;  // its first query and key token
  long long total_q;       // query tokens of the batch: lse and delta are (H, total_q)

  // Sequence b of a packed kernel's argument; a dense kernel's (VARLEN false) gets an unused zero value.
  template <bool VARLEN, class Params>
  FT_HD static VarlenSeq of(const Params& p, int b) {
    if constexpr (VARLEN) {
      const long long q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
      return VarlenSeq{static_cast<int>(p.cu_seqlens_q[b + 1] - q0), static_cast<int>(p.cu_seqlens_k[b + 1] - k0), q0,
                       k0, p.cu_seqlens_q[p.batch]};
    } else {
      return VarlenSeq{0, 0, 0, 0, 0};
    }
  }
  // Row 0 of query head h (of `heads`) in Q, O, dO, dQ: rows H*D elements apart.
  FT_HD long long q_offset(int heads, int h, int D) const { return (q_tok0 * heads + h) * D; }
  // Row 0 of kv head hk (of `kv_heads`) in K, V, dK, dV: rows kv_heads*D elements apart.
  FT_HD long long k_offset(int kv_heads, int hk, int D) const { return (k_tok0 * kv_heads + hk) * D; }
  // Entry 0 of query head h in lse and delta: consecutive.
  FT_HD long long lse_offset(int h) const { return h * total_q + q_tok0; }
};

}  // namespace flashtune
