// The one kernel argument every attention kernel takes. Plain C++ so that the
// host (tuner worker, consumer builds) and the device (NVRTC, nvcc) share it.
#pragma once

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
