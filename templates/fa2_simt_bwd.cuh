// FlashAttention-2 backward on CUDA cores, fp32 in/out. Three kernels, launched in order:
//   fa2_simt_bwd_preprocess<T>  delta[i] = sum_c dO[i][c] O[i][c]; DQ_MODE 0: dq_accum = 0
//   fa2_simt_bwd_dkdv<T>        one CTA per K/V block: dK, dV; DQ_MODE 0 also dq_accum += dS K (atomics)
//   fa2_simt_bwd_dq<T>          DQ_MODE 0: dQ = dq_accum; DQ_MODE 1: one CTA per query block,
//                               dQ = scale * sum_j dS_ij K_j in registers, fixed order (deterministic)
// with T = Fa2SimtBwdTraits<D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE, CAUSAL>. Threads, grid and
// dynamic shared memory of each kernel: fa2_simt_bwd_<kernel>_{threads,grid,smem_bytes} in
// fa2_simt_bwd_traits.h (checked at entry).
//
// Main kernels (dK/dV, and dQ in DQ_MODE 1). The score tile is held transposed, S^T (BN keys x
// BM queries), so that dK, dV rows and score rows belong to the same thread. Thread layout: TR x TC
// (TR = BN/TN, TC = BM/TM), the TC threads of a thread-row adjacent lanes of one warp:
// tx = lane % TC, ty = warp*(32/TC) + lane/TC. Thread (ty, tx) owns
//   S^T, P^T, dP^T, dS^T  key rows n = ty + TR*a (a < TN), query cols m = tx + TC*b (b < TM)
//   dK, dV                key rows n = ty + TR*a, cols c = 4*tx + 4*TC*e .. +3 (e < D/(4*TC))
//   dQ                    query rows m = ty*QM + r (r < QM = BM/TR), the same cols c
// Shared memory: Ks, Vs [BN][D+4], Qs, dOs [BM][D+4], Ps [BN][BM+4] (P^T, then scale*dS^T).
// Every shared-memory read of the inner loops is a 16-byte read, broadcast within a thread-row
// or contiguous across its lanes (conflict free with the 4-float row padding).
//
// Masking: K/V rows past seq_k and query rows past seq_q are zero-filled; a query row past
// seq_q or fully masked gets lse = +inf, so P = exp2(-inf) = 0 and dS = 0 without a test.
// Keys past seq_k and (causal, bottom-right) keys j > i + (seq_k - seq_q) are zeroed in P,
// only in tiles that straddle the seq_k end or the diagonal.
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa2_simt_bwd_traits.h"

namespace flashtune {

namespace fa2_simt_bwd_detail {

template <class T>
using ScoreTile = float[T::kTN][T::kTM];

// C[a][b] = sum_d A[ty + TR*a][d] * B[tx + TC*b][d]  (S^T = K Q^T with A = Ks, B = Qs;
// dP^T = V dO^T with A = Vs, B = dOs).
template <class T>
__device__ __forceinline__ void tile_abt(ScoreTile<T>& c, const float* A, const float* B, int ty, int tx) {
  tile_a_bt<T::kTN, T::kTM, T::kHeadDim, T::kTR, T::kTC, T::kRowStride, T::kRowStride>(c, A, B, ty, tx);
}

// Per query column m = m0 + tx + TC*b of this thread: -lse*log2(e) and delta; rows past seq_q
// get -inf and 0 (P = 0 there).
template <class T>
__device__ __forceinline__ void load_row_stats(float (&neg_lse2)[T::kTM], float (&dlt)[T::kTM], const float* lse,
                                               const float* delta, int m_first, int seq_q) {
#pragma unroll
  for (int b = 0; b < T::kTM; ++b) {
    const int m = m_first + b * T::kTC;
    const bool ok = m < seq_q;
    neg_lse2[b] = ok ? -lse[m] * kLog2e : neg_inf();
    dlt[b] = ok ? delta[m] : 0.f;
  }
}

// In place: s = S^T -> P^T = exp2(S^T*scale_log2 - lse*log2 e) (0 where the key is masked),
// dp = dP^T -> scale * dS^T = scale * P^T (dP^T - delta).
template <class T>
__device__ __forceinline__ void probs_and_dscores(ScoreTile<T>& s, ScoreTile<T>& dp, const float (&neg_lse2)[T::kTM],
                                                  const float (&dlt)[T::kTM], float scale_log2, float scale,
                                                  bool needs_mask, int n_first, int m_first, int seq_k,
                                                  int causal_offset) {
#pragma unroll
  for (int a = 0; a < T::kTN; ++a) {
    const int n = n_first + a * T::kTR;
#pragma unroll
    for (int b = 0; b < T::kTM; ++b) {
      const int m = m_first + b * T::kTC;
      float pv = fast_exp2(fmaf(s[a][b], scale_log2, neg_lse2[b]));
      if (needs_mask && (n >= seq_k || (T::kCausal && n > m + causal_offset))) pv = 0.f;
      s[a][b] = pv;
      dp[a][b] = scale * pv * (dp[a][b] - dlt[b]);
    }
  }
}

// Ps[ty + TR*a][tx + TC*b] = t[a][b]
template <class T>
__device__ __forceinline__ void store_tile(const ScoreTile<T>& t, float* Ps, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < T::kTN; ++a)
#pragma unroll
    for (int b = 0; b < T::kTM; ++b) Ps[(ty + a * T::kTR) * T::kPStride + tx + b * T::kTC] = t[a][b];
}

// acc[a][e] += sum_m Ps[ty + TR*a][m] * X[m][4*tx + 4*TC*e .. +3]
// (dV += P^T dO with X = dOs; dK += scale dS^T Q with X = Qs).
template <class T>
__device__ __forceinline__ void accumulate_rows(float4 (&acc)[T::kTN][T::kChunks], const float* Ps, const float* X,
                                                int ty, int tx) {
  accumulate_p_x<T::kTN, T::kChunks, T::kBlockM, T::kTR, T::kTC, T::kPStride, T::kRowStride>(acc, Ps, X, ty, tx);
}

// QM consecutive floats of shared memory (16-, 8- or 4-byte reads as alignment allows).
template <int QM>
__device__ __forceinline__ void lds_frag(float (&x)[QM], const float* p) {
  if constexpr (QM % 4 == 0) {
#pragma unroll
    for (int r = 0; r < QM; r += 4) {
      const float4 v = lds128(p + r);
      x[r] = v.x;
      x[r + 1] = v.y;
      x[r + 2] = v.z;
      x[r + 3] = v.w;
    }
  } else if constexpr (QM % 2 == 0) {
#pragma unroll
    for (int r = 0; r < QM; r += 2) {
      const float2 v = *reinterpret_cast<const float2*>(p + r);
      x[r] = v.x;
      x[r + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int r = 0; r < QM; ++r) x[r] = p[r];
  }
}

// acc[r][e] += sum_n Ps[n][ty*QM + r] * Ks[n][4*tx + 4*TC*e .. +3]   (dQ_i += scale dS K_j,
// Ps holding scale * dS^T).
template <class T>
__device__ __forceinline__ void accumulate_dq(float4 (&acc)[T::kQM][T::kChunks], const float* Ps, const float* Ks,
                                              int ty, int tx) {
  const float* pcol = Ps + ty * T::kQM;
  const float* kcol = Ks + 4 * tx;
#pragma unroll 4
  for (int n = 0; n < T::kBlockN; ++n) {
    float pf[T::kQM];
    lds_frag<T::kQM>(pf, pcol + n * T::kPStride);
    float4 kf[T::kChunks];
#pragma unroll
    for (int e = 0; e < T::kChunks; ++e) kf[e] = lds128(kcol + n * T::kRowStride + 4 * T::kTC * e);
#pragma unroll
    for (int r = 0; r < T::kQM; ++r)
#pragma unroll
      for (int e = 0; e < T::kChunks; ++e) ffma4(acc[r][e], pf[r], kf[e]);
  }
}

template <int ROWS, int CHUNKS>
__device__ __forceinline__ void zero_acc(float4 (&acc)[ROWS][CHUNKS]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int e = 0; e < CHUNKS; ++e) acc[r][e] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// Tiles straddling the seq_k end or (causal) the diagonal need the key mask: the block's first
// query row m0 must see its last key n0 + BN - 1.
template <class T>
__device__ __forceinline__ bool tile_needs_mask(int m0, int n0, int seq_k, int causal_offset) {
  return (n0 + T::kBlockN > seq_k) || (T::kCausal && n0 + T::kBlockN - 1 > m0 + causal_offset);
}

}  // namespace fa2_simt_bwd_detail

// delta[b,h,i] = sum_c dO[i][c] * O[i][c]; DQ_MODE 0 also zeroes dq_accum. kRowLanes lanes per row.
template <class Traits>
__global__ void __launch_bounds__(Traits::kPreThreads) fa2_simt_bwd_preprocess(const AttnBwdParams p) {
  using T = Traits;
  constexpr int D = T::kHeadDim;
  check_dynamic_smem(T::kPreSmemBytes);
  const int tid = threadIdx.x;
  const int g = tid % T::kRowLanes;
  const int row = blockIdx.x * T::kRowsPerCta + tid / T::kRowLanes;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const bool ok = row < p.seq_q;
  const long long off = (bh * p.seq_q + row) * D;
  float acc = 0.f;
  if (ok) {
    const float* o = static_cast<const float*>(p.o) + off;
    const float* dout = static_cast<const float*>(p.dout) + off;
#pragma unroll
    for (int k = 0; k < T::kRowChunks; ++k) {
      const int c = 4 * (g + T::kRowLanes * k);
      acc = dot4_acc(*reinterpret_cast<const float4*>(dout + c), *reinterpret_cast<const float4*>(o + c), acc);
      if constexpr (T::kDqMode == 0) *reinterpret_cast<float4*>(p.dq_accum + off + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  acc = group_sum<T::kRowLanes>(acc);  // every lane takes part (no early exit before the shuffles)
  if (ok && g == 0) p.delta[bh * p.seq_q + row] = acc;
}

// One CTA per K/V block j (x), head (y), batch (z): dK_j, dV_j over every query block i that
// can see the block; DQ_MODE 0 also dq_accum[i] += scale * dS_ij K_j.
template <class Traits>
__global__ void __launch_bounds__(Traits::kDkdvThreads, Traits::kMinBlocks) fa2_simt_bwd_dkdv(const AttnBwdParams p) {
  using T = Traits;
  namespace det = fa2_simt_bwd_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int TN = T::kTN;
  constexpr int TC = T::kTC;
  constexpr int E = T::kChunks;
  constexpr int NT = T::kDkdvThreads;
  constexpr int RS = T::kRowStride;
  check_dynamic_smem(T::kDkdvSmemBytes);

  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;           // [BN][D+4]
  float* Vs = Ks + BN * RS;   // [BN][D+4]
  float* Qs = Vs + BN * RS;   // [BM][D+4]
  float* dOs = Qs + BM * RS;  // [BM][D+4]
  float* Ps = dOs + BM * RS;  // [BN][BM+4]: P^T, then scale * dS^T

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int tx = lane % TC;
  const int ty = (tid >> 5) * (32 / TC) + lane / TC;

  const int seq_q = p.seq_q;
  const int seq_k = p.seq_k;
  const int n0 = blockIdx.x * BN;
  if (n0 >= seq_k) return;  // whole block: safe before any barrier
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const float* q = static_cast<const float*>(p.q) + bh * seq_q * D;
  const float* k = static_cast<const float*>(p.k) + bh * seq_k * D;
  const float* v = static_cast<const float*>(p.v) + bh * seq_k * D;
  const float* dout = static_cast<const float*>(p.dout) + bh * seq_q * D;
  const float* lse = p.lse + bh * seq_q;
  const float* delta = p.delta + bh * seq_q;

  // Query i sees key n iff n <= i + causal_offset: only query blocks reaching row n0 - causal_offset.
  const int causal_offset = seq_k - seq_q;
  const int num_m_blocks = ceil_div(seq_q, BM);
  const int first_m_block = T::kCausal ? imax(0, n0 - causal_offset) / BM : 0;

  float4 dk[TN][E], dv[TN][E];
  det::zero_acc(dk);
  det::zero_acc(dv);

  cp_async_rows_f32<BN, D, RS, NT>(Ks, k, n0, seq_k, tid);
  cp_async_rows_f32<BN, D, RS, NT>(Vs, v, n0, seq_k, tid);
  if (first_m_block < num_m_blocks) cp_async_rows_f32<BM, D, RS, NT>(dOs, dout, first_m_block * BM, seq_q, tid);
  cp_async_commit();

  // Per query block, 5 barriers. dO(i) lands during dK/dQ of block i-1, Q(i) during dP(i).
  for (int mb = first_m_block; mb < num_m_blocks; ++mb) {
    const int m0 = mb * BM;
    float neg_lse2[T::kTM], dlt[T::kTM];
    det::load_row_stats<T>(neg_lse2, dlt, lse, delta, m0 + tx, seq_q);

    cp_async_wait<0>();  // dO(i) (K, V too on the first pass)
    __syncthreads();     // dO(i) visible; everyone done with Qs and Ps of block i-1
    cp_async_rows_f32<BM, D, RS, NT>(Qs, q, m0, seq_q, tid);
    cp_async_commit();

    float dpt[TN][T::kTM];
    det::tile_abt<T>(dpt, Vs, dOs, ty, tx);  // dP^T = V dO^T

    cp_async_wait<0>();  // Q(i)
    __syncthreads();     // Q(i) visible
    float st[TN][T::kTM];
    det::tile_abt<T>(st, Ks, Qs, ty, tx);  // S^T = K Q^T
    const bool needs_mask = det::tile_needs_mask<T>(m0, n0, seq_k, causal_offset);
    det::probs_and_dscores<T>(st, dpt, neg_lse2, dlt, p.scale_log2, p.scale, needs_mask, n0 + ty, m0 + tx, seq_k,
                              causal_offset);
    det::store_tile<T>(st, Ps, ty, tx);  // P^T
    __syncthreads();                     // P^T visible
    det::accumulate_rows<T>(dv, Ps, dOs, ty, tx);  // dV += P^T dO
    __syncthreads();                               // everyone done with P^T and dO(i)
    if (mb + 1 < num_m_blocks) cp_async_rows_f32<BM, D, RS, NT>(dOs, dout, m0 + BM, seq_q, tid);
    cp_async_commit();
    det::store_tile<T>(dpt, Ps, ty, tx);  // scale * dS^T
    __syncthreads();                      // dS^T visible
    det::accumulate_rows<T>(dk, Ps, Qs, ty, tx);  // dK += scale dS^T Q

    if constexpr (T::kDqMode == 0) {
      float4 dq[T::kQM][E];
      det::zero_acc(dq);
      det::accumulate_dq<T>(dq, Ps, Ks, ty, tx);  // scale dS K_j
      float* dq_accum = p.dq_accum + bh * seq_q * D;
#pragma unroll
      for (int r = 0; r < T::kQM; ++r) {
        const int m = m0 + ty * T::kQM + r;
        if (m < seq_q) {
#pragma unroll
          for (int e = 0; e < E; ++e) red_add_f32x4(dq_accum + static_cast<long long>(m) * D + 4 * tx + 4 * TC * e, dq[r][e]);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may stay in flight at exit (no query block: K, V unused)

  // dK, dV rows; zeros for a block no query sees.
  float* dk_out = static_cast<float*>(p.dk) + bh * seq_k * D;
  float* dv_out = static_cast<float*>(p.dv) + bh * seq_k * D;
#pragma unroll
  for (int a = 0; a < TN; ++a) {
    const int n = n0 + ty + a * T::kTR;
    if (n < seq_k) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const long long off = static_cast<long long>(n) * D + 4 * tx + 4 * TC * e;
        *reinterpret_cast<float4*>(dk_out + off) = dk[a][e];
        *reinterpret_cast<float4*>(dv_out + off) = dv[a][e];
      }
    }
  }
}

// DQ_MODE 0: dQ = dq_accum (row kernel). DQ_MODE 1: one CTA per query block (x, reversed when
// causal so the heaviest blocks start first), head (y), batch (z): dQ_i = scale * sum_j dS_ij K_j
// over the visible K/V blocks in increasing j, in registers; bitwise deterministic.
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads, Traits::kDqMode == 0 ? 1 : Traits::kMinBlocks) fa2_simt_bwd_dq(const AttnBwdParams p) {
  using T = Traits;
  namespace det = fa2_simt_bwd_detail;
  constexpr int D = T::kHeadDim;
  check_dynamic_smem(T::kDqSmemBytes);
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const int seq_q = p.seq_q;
  const int tid = threadIdx.x;

  if constexpr (T::kDqMode == 0) {
    const int g = tid % T::kRowLanes;
    const int row = blockIdx.x * T::kRowsPerCta + tid / T::kRowLanes;
    if (row >= seq_q) return;  // no barriers in this kernel
    const long long off = (bh * seq_q + row) * D;
#pragma unroll
    for (int k = 0; k < T::kRowChunks; ++k) {
      const int c = 4 * (g + T::kRowLanes * k);
      *reinterpret_cast<float4*>(static_cast<float*>(p.dq) + off + c) =
          *reinterpret_cast<const float4*>(p.dq_accum + off + c);
    }
  } else {
    constexpr int BM = T::kBlockM;
    constexpr int BN = T::kBlockN;
    constexpr int TC = T::kTC;
    constexpr int E = T::kChunks;
    constexpr int NT = T::kDqThreads;
    constexpr int RS = T::kRowStride;
    extern __shared__ __align__(16) float smem[];
    float* Ks = smem;           // [BN][D+4]
    float* Vs = Ks + BN * RS;   // [BN][D+4]
    float* Qs = Vs + BN * RS;   // [BM][D+4]
    float* dOs = Qs + BM * RS;  // [BM][D+4]
    float* Ps = dOs + BM * RS;  // [BN][BM+4]: scale * dS^T

    const int lane = tid & 31;
    const int tx = lane % TC;
    const int ty = (tid >> 5) * (32 / TC) + lane / TC;
    const int seq_k = p.seq_k;
    const int qblock = T::kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    const int m0 = qblock * BM;
    if (m0 >= seq_q) return;  // whole block: safe before any barrier
    const float* q = static_cast<const float*>(p.q) + bh * seq_q * D;
    const float* k = static_cast<const float*>(p.k) + bh * seq_k * D;
    const float* v = static_cast<const float*>(p.v) + bh * seq_k * D;
    const float* dout = static_cast<const float*>(p.dout) + bh * seq_q * D;

    // Keys [0, kv_end) can be visible to some row of this block.
    const int causal_offset = seq_k - seq_q;
    int kv_end = seq_k;
    if (T::kCausal) kv_end = imin(seq_k, imin(m0 + BM, seq_q) + causal_offset);
    const int num_n_blocks = kv_end > 0 ? ceil_div(kv_end, BN) : 0;

    float neg_lse2[T::kTM], dlt[T::kTM];
    det::load_row_stats<T>(neg_lse2, dlt, p.lse + bh * seq_q, p.delta + bh * seq_q, m0 + tx, seq_q);
    float4 dq[T::kQM][E];
    det::zero_acc(dq);

    cp_async_rows_f32<BM, D, RS, NT>(Qs, q, m0, seq_q, tid);
    cp_async_rows_f32<BM, D, RS, NT>(dOs, dout, m0, seq_q, tid);
    if (num_n_blocks > 0) cp_async_rows_f32<BN, D, RS, NT>(Vs, v, 0, seq_k, tid);
    cp_async_commit();

    // Per K/V block, 3 barriers. K(j) lands during dP(j), V(j+1) during S(j) and dQ += dS K(j).
    for (int nb = 0; nb < num_n_blocks; ++nb) {
      const int n0 = nb * BN;
      cp_async_wait<0>();  // V(j) (Q, dO too on the first pass)
      __syncthreads();     // V(j) visible; everyone done with Ks and Ps of block j-1
      cp_async_rows_f32<BN, D, RS, NT>(Ks, k, n0, seq_k, tid);
      cp_async_commit();

      float dpt[T::kTN][T::kTM];
      det::tile_abt<T>(dpt, Vs, dOs, ty, tx);  // dP^T = V dO^T

      cp_async_wait<0>();  // K(j)
      __syncthreads();     // K(j) visible; everyone done with Vs
      if (nb + 1 < num_n_blocks) cp_async_rows_f32<BN, D, RS, NT>(Vs, v, n0 + BN, seq_k, tid);
      cp_async_commit();

      float st[T::kTN][T::kTM];
      det::tile_abt<T>(st, Ks, Qs, ty, tx);  // S^T = K Q^T
      const bool needs_mask = det::tile_needs_mask<T>(m0, n0, seq_k, causal_offset);
      det::probs_and_dscores<T>(st, dpt, neg_lse2, dlt, p.scale_log2, p.scale, needs_mask, n0 + ty, m0 + tx,
                                seq_k, causal_offset);
      det::store_tile<T>(dpt, Ps, ty, tx);  // scale * dS^T
      __syncthreads();                      // dS^T visible
      det::accumulate_dq<T>(dq, Ps, Ks, ty, tx);  // dQ += scale dS K_j
    }
    cp_async_wait<0>();

    float* dq_out = static_cast<float*>(p.dq) + bh * seq_q * D;
#pragma unroll
    for (int r = 0; r < T::kQM; ++r) {
      const int m = m0 + ty * T::kQM + r;
      if (m < seq_q) {
#pragma unroll
        for (int e = 0; e < E; ++e)
          *reinterpret_cast<float4*>(dq_out + static_cast<long long>(m) * D + 4 * tx + 4 * TC * e) = dq[r][e];
      }
    }
  }
}

}  // namespace flashtune
