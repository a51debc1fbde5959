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

}  // namespace flashtune
