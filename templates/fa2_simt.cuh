// FlashAttention-2 forward on CUDA cores, fp32 in/out.
//   fa2_simt_fwd<Fa2SimtTraits<D, BLOCK_M, BLOCK_N, TM, TN, KV_STAGES, CAUSAL>>
// Grid: x = ceil(seq_q / BLOCK_M) query blocks, y = heads, z = batch; kThreads threads;
// kSmemBytes dynamic shared memory (checked at entry).
//
// Thread layout: TR x TC threads (TR = BM/TM, TC = BN/TN); the TC threads of one
// thread-row are adjacent lanes of one warp: tx = lane % TC, ty = warp*(32/TC) + lane/TC.
// Thread (ty, tx) owns query rows  i = ty + TR*a        (a < TM),
//                       score cols j = tx + TC*b        (b < TN),
//                       out cols   c = 4*tx + 4*TC*e .. +3  (e < D/(4*TC)).
// Strided ownership keeps every shared-memory read conflict free (16-byte reads of rows
// with a 4-float pad; threads of one thread-row broadcast the same Q/P row).
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa2_simt_traits.h"

namespace flashtune {

namespace fa2_simt_detail {

// Q block into shared memory, multiplied by scale_log2 (scores come out in the exp2 domain).
template <int ROWS, int D, int STRIDE, int NT>
__device__ __forceinline__ void load_q_scaled(float* dst, const float* src, int row0, int seq, float scale,
                                              int tid) {
  constexpr int kChunksPerRow = D / 4;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int idx = tid; idx < kChunks; idx += NT) {
    const int r = idx / kChunksPerRow;
    const int c4 = idx % kChunksPerRow;
    const int grow = row0 + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (grow < seq) {
      x = *reinterpret_cast<const float4*>(src + static_cast<long long>(grow) * D + 4 * c4);
      x.x *= scale;
      x.y *= scale;
      x.z *= scale;
      x.w *= scale;
    }
    sts128(dst + r * STRIDE + 4 * c4, x);
  }
}

__device__ __forceinline__ void scale4(float4& acc, float s) {
  acc.x *= s;
  acc.y *= s;
  acc.z *= s;
  acc.w *= s;
}

// S[a][b] = sum_d Qs[ty+TR*a][d] * Ks[tx+TC*b][d]  (Q already scaled to the exp2 domain).
template <class T>
__device__ __forceinline__ void compute_scores(float (&s)[T::kTM][T::kTN], const float* Qs, const float* Ks, int ty,
                                               int tx) {
  tile_a_bt<T::kTM, T::kTN, T::kHeadDim, T::kTR, T::kTC, T::kQStride, T::kKvStride>(s, Qs, Ks, ty, tx);
}

// -inf where key j is past seq_k or (causal) j > i + (seq_k - seq_q).
template <class T>
__device__ __forceinline__ void apply_mask(float (&s)[T::kTM][T::kTN], int row0, int col0, int seq_k,
                                           int causal_offset) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    const int i = row0 + a * T::kTR;
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) {
      const int j = col0 + b * T::kTC;
      if (j >= seq_k || (T::kCausal && j > i + causal_offset)) s[a][b] = neg_inf();
    }
  }
}

// Online softmax for one K/V block: S -> P = exp2(S - m_new) in place, rescale l and O by
// alpha = exp2(m_old - m_new). l stays a per-thread partial sum (reduced in the epilogue).
// A row with no visible key so far keeps m = -inf; exponents use base 0 then, so no
// (-inf) - (-inf) = NaN: P = 0, alpha = 0.
template <class T>
__device__ __forceinline__ void online_softmax(float (&s)[T::kTM][T::kTN], float (&m)[T::kTM], float (&l)[T::kTM],
                                               float4 (&o)[T::kTM][T::kOChunks]) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    float mx = s[a][0];
#pragma unroll
    for (int b = 1; b < T::kTN; ++b) mx = fmaxf(mx, s[a][b]);
    mx = group_max<T::kTC>(mx);  // over the TC lanes sharing a thread-row
    const float m_new = fmaxf(m[a], mx);
    const float base = (m_new == neg_inf()) ? 0.f : m_new;
    const float alpha = fast_exp2(m[a] - base);
    m[a] = m_new;
    float rs = 0.f;
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) {
      s[a][b] = fast_exp2(s[a][b] - base);
      rs += s[a][b];
    }
    l[a] = fmaf(l[a], alpha, rs);
#pragma unroll
    for (int e = 0; e < T::kOChunks; ++e) scale4(o[a][e], alpha);
  }
}

template <class T>
__device__ __forceinline__ void store_p(const float (&s)[T::kTM][T::kTN], float* Ps, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a)
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) Ps[(ty + a * T::kTR) * T::kPStride + tx + b * T::kTC] = s[a][b];
}

// O[a][e] += sum_j Ps[ty+TR*a][j] * Vs[j][4*tx + 4*TC*e .. +3]
template <class T>
__device__ __forceinline__ void accumulate_pv(float4 (&o)[T::kTM][T::kOChunks], const float* Ps, const float* Vs,
                                              int ty, int tx) {
  accumulate_p_x<T::kTM, T::kOChunks, T::kBlockN, T::kTR, T::kTC, T::kPStride, T::kKvStride>(o, Ps, Vs, ty, tx);
}

}  // namespace fa2_simt_detail

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) fa2_simt_fwd(const AttnFwdParams p) {
  using T = Traits;
  namespace det = fa2_simt_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int TM = T::kTM;
  constexpr int TC = T::kTC;
  constexpr int NT = T::kThreads;
  constexpr int KVS = T::kKvStride;
  constexpr bool CAUSAL = T::kCausal;
  check_dynamic_smem(T::kSmemBytes);

  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;                                 // [BM][D+4]
  float* KVs = Qs + BM * T::kQStride;               // KV_STAGES x { Ks[BN][D+4], Vs[BN][D+4] }
  float* Ps = KVs + T::kKvStages * 2 * BN * KVS;    // [BM][BN+4]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int tx = lane % TC;
  const int ty = (tid >> 5) * (32 / TC) + lane / TC;

  const int seq_q = p.seq_q;
  const int seq_k = p.seq_k;
  // Causal: the heaviest query blocks (largest i, most visible keys) launch first.
  const int qblock = CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int m0 = qblock * BM;
  if (m0 >= seq_q) return;  // whole block: safe before any barrier
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const float* q = static_cast<const float*>(p.q) + bh * seq_q * D;
  const float* k = static_cast<const float*>(p.k) + bh * seq_k * D;
  const float* v = static_cast<const float*>(p.v) + bh * seq_k * D;
  float* o_out = static_cast<float*>(p.o) + bh * seq_q * D;
  float* lse_out = p.lse + bh * seq_q;

  // Key j is visible to query i iff j <= i + causal_offset (bottom-right aligned).
  const int causal_offset = seq_k - seq_q;
  int kv_end = seq_k;  // keys [0, kv_end) can be visible to some row of this block
  if (CAUSAL) kv_end = imin(seq_k, imin(m0 + BM, seq_q) - 1 + causal_offset + 1);
  const int num_kv_blocks = kv_end > 0 ? (kv_end + BN - 1) / BN : 0;

  float m[TM], l[TM];
  float4 o[TM][T::kOChunks];
#pragma unroll
  for (int a = 0; a < TM; ++a) {
    m[a] = neg_inf();
    l[a] = 0.f;
#pragma unroll
    for (int e = 0; e < T::kOChunks; ++e) o[a][e] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  auto k_tile = [&](int stage) { return KVs + stage * 2 * BN * KVS; };
  auto v_tile = [&](int stage) { return KVs + stage * 2 * BN * KVS + BN * KVS; };

  // Scores, mask, online softmax and P -> shared memory for the block starting at key n0.
  auto scores_to_p = [&](const float* Ks, int n0) {
    float s[TM][T::kTN];
    det::compute_scores<T>(s, Qs, Ks, ty, tx);
    // Only blocks straddling the seq_k end or the diagonal (first row's last key) need a mask.
    const bool needs_mask = (n0 + BN > seq_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset);
    if (needs_mask) det::apply_mask<T>(s, m0 + ty, n0 + tx, seq_k, causal_offset);
    det::online_softmax<T>(s, m, l, o);
    det::store_p<T>(s, Ps, ty, tx);
  };

  det::load_q_scaled<BM, D, T::kQStride, NT>(Qs, q, m0, seq_q, p.scale_log2, tid);

  if constexpr (T::kKvStages == 1) {
    // One K/V buffer. V(n) lands while S(n) is computed; K(n+1) lands during O += P V(n).
    if (num_kv_blocks > 0) cp_async_rows_f32<BN, D, KVS, NT>(k_tile(0), k, 0, seq_k, tid);
    cp_async_commit();
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      const int n0 = nb * BN;
      cp_async_wait<0>();  // K(n) (the only group in flight)
      __syncthreads();     // K(n), Qs visible; everyone done with Vs and Ps of block n-1
      cp_async_rows_f32<BN, D, KVS, NT>(v_tile(0), v, n0, seq_k, tid);
      cp_async_commit();
      scores_to_p(k_tile(0), n0);
      cp_async_wait<0>();  // V(n)
      __syncthreads();     // V(n), Ps visible; everyone done reading Ks
      if (nb + 1 < num_kv_blocks) cp_async_rows_f32<BN, D, KVS, NT>(k_tile(0), k, n0 + BN, seq_k, tid);
      cp_async_commit();
      det::accumulate_pv<T>(o, Ps, v_tile(0), ty, tx);
    }
  } else {
    // Double buffer: block n+1 is in flight while block n is computed.
    if (num_kv_blocks > 0) {
      cp_async_rows_f32<BN, D, KVS, NT>(k_tile(0), k, 0, seq_k, tid);
      cp_async_rows_f32<BN, D, KVS, NT>(v_tile(0), v, 0, seq_k, tid);
    }
    cp_async_commit();
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      const int n0 = nb * BN;
      const int stage = nb & 1;
      cp_async_wait<0>();  // block n (the only group in flight)
      __syncthreads();     // block n, Qs visible; everyone done with block n-1 (its stage, Ps)
      if (nb + 1 < num_kv_blocks) {
        cp_async_rows_f32<BN, D, KVS, NT>(k_tile(stage ^ 1), k, n0 + BN, seq_k, tid);
        cp_async_rows_f32<BN, D, KVS, NT>(v_tile(stage ^ 1), v, n0 + BN, seq_k, tid);
      }
      cp_async_commit();
      scores_to_p(k_tile(stage), n0);
      __syncthreads();  // Ps visible
      det::accumulate_pv<T>(o, Ps, v_tile(stage), ty, tx);
    }
  }

  // Epilogue: full row sums, O /= l, lse = (m + log2 l) * ln2; fully masked rows: O = 0, lse = +inf.
#pragma unroll
  for (int a = 0; a < TM; ++a) {
    const float lt = group_sum<TC>(l[a]);
    const int i = m0 + ty + a * T::kTR;
    if (i < seq_q) {
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      float* orow = o_out + static_cast<long long>(i) * D + 4 * tx;
#pragma unroll
      for (int e = 0; e < T::kOChunks; ++e) {
        float4 r = o[a][e];
        det::scale4(r, inv);
        *reinterpret_cast<float4*>(orow + 4 * TC * e) = r;
      }
      if (tx == 0) lse_out[i] = lt > 0.f ? (m[a] + fast_log2(lt)) * kLn2 : pos_inf();
    }
  }
}

}  // namespace flashtune
