// Unfused baseline: materialises the score matrix in p.workspace (B,H,Sq,Sk floats).
// One block per query row (grid x = seq_q, y = heads, z = batch). fp32 in/out.
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "naive_traits.h"

namespace flashtune {

namespace naive_detail {

// Block-wide reduction (max or sum); every thread gets the result. red has THREADS/32 floats.
template <int THREADS, bool IS_MAX>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  constexpr int kWarps = THREADS / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, off);
    v = IS_MAX ? fmaxf(v, u) : v + u;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) v = IS_MAX ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

}  // namespace naive_detail

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads) naive_fwd(const AttnFwdParams p) {
  constexpr int D = Traits::kHeadDim;
  constexpr int NT = Traits::kThreads;
  constexpr bool CAUSAL = Traits::kCausal;
  check_dynamic_smem(Traits::kSmemBytes);

  extern __shared__ __align__(16) float smem[];
  float* qs = smem;       // [D], pre-scaled by scale_log2
  float* red = smem + D;  // [NT/32]

  const int tid = threadIdx.x;
  const int i = blockIdx.x;
  const int seq_q = p.seq_q, seq_k = p.seq_k;
  if (i >= seq_q) return;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const float* q = static_cast<const float*>(p.q) + (bh * seq_q + i) * D;
  const float* k = static_cast<const float*>(p.k) + bh * seq_k * D;
  const float* v = static_cast<const float*>(p.v) + bh * seq_k * D;
  float* o = static_cast<float*>(p.o) + (bh * seq_q + i) * D;
  float* s = p.workspace + (bh * seq_q + i) * static_cast<long long>(seq_k);

  for (int c = tid; c < D; c += NT) qs[c] = q[c] * p.scale_log2;
  __syncthreads();

  // Scores in the exp2 domain, masked to -inf; key j visible iff j <= i + (seq_k - seq_q).
  const int last_key = CAUSAL ? i + (seq_k - seq_q) : seq_k - 1;
  float mx = neg_inf();
  for (int j = tid; j < seq_k; j += NT) {
    float acc = neg_inf();
    if (j <= last_key) {
      acc = 0.f;
      const float* kr = k + static_cast<long long>(j) * D;
#pragma unroll 8
      for (int c = 0; c < D; ++c) acc = fmaf(qs[c], kr[c], acc);
    }
    s[j] = acc;
    mx = fmaxf(mx, acc);
  }
  const float m = naive_detail::block_reduce<NT, true>(mx, red);

  if (m == neg_inf()) {  // fully masked row (uniform across the block)
    for (int c = tid; c < D; c += NT) o[c] = 0.f;
    if (tid == 0) p.lse[bh * seq_q + i] = pos_inf();
    return;
  }

  // Each thread rewrites only the entries it wrote itself.
  float sum = 0.f;
  for (int j = tid; j < seq_k; j += NT) {
    const float e = fast_exp2(s[j] - m);
    s[j] = e;
    sum += e;
  }
  const float l = naive_detail::block_reduce<NT, false>(sum, red);  // its barriers publish s[]

  const float inv_l = 1.f / l;
  for (int c = tid; c < D; c += NT) {
    float acc = 0.f;
    for (int j = 0; j < seq_k; ++j) acc = fmaf(s[j], v[static_cast<long long>(j) * D + c], acc);
    o[c] = acc * inv_l;
  }
  if (tid == 0) p.lse[bh * seq_q + i] = (m + fast_log2(l)) * kLn2;
}

}  // namespace flashtune
