// FlashAttention-1 forward on CUDA cores, fp32 in/out (Algorithm 1 of Dao et al., 2022).
//   fa1_simt_fwd<Fa1SimtTraits<D, BLOCK_M, BLOCK_N, TM, TN, Q_STAGES, Q_SPLIT, CAUSAL>>
// Grid: x = min(Q_SPLIT, ceil(seq_q / BLOCK_M)) query-block groups, y = heads, z = batch;
// kThreads threads; kSmemBytes dynamic shared memory (checked at entry);
// p.workspace: fa1_simt_workspace_floats(B, H, Sq) floats (running m, then running l).
//
// Loop order: K/V blocks OUTER, query blocks INNER. CTA g of a (batch, head) owns the query
// blocks g, g + Q_SPLIT, ... (Q_SPLIT = 1: all of them, FlashAttention-1's grid). For every K/V
// block j it loads K_j, V_j once into shared memory, then for each of its query blocks i:
//   load Q_i (shared memory), O_i, m_i, l_i (global memory -> registers)
//   S = Q_i K_j^T;  m_new = max(m_i, rowmax S);  P = exp(S - m_new)
//   l_new = e^(m_i - m_new) l_i + rowsum P
//   O_i = (e^(m_i - m_new) l_i O_i + P V_j) / l_new
//   write O_i, m_new, l_new back to global memory (after the last K/V block of Q_i: LSE)
// so O (normalised, in p.o itself), m and l make a round trip through global memory on every
// (K/V block, query block) step; FlashAttention-2 keeps them in registers. (The paper's
// e^(m~ - m_new) P~ with P~ = exp(S - rowmax S) is computed directly as exp(S - m_new).)
// The first K/V block treats O, m, l as fresh (0, -inf, 0) without reading them; since every
// causal row that sees a key sees key 0, j = 0 is the first visit of every visited query block.
//
// Thread layout (as fa2_simt): TR x TC threads, the TC threads of a thread-row are adjacent lanes;
// thread (ty, tx) owns query rows ty + TR*a, score columns tx + TC*b, output columns
// 4*tx + 4*TC*e .. +3. Scores are in the exp2 domain (S * scale * log2 e).
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa1_simt_traits.h"

namespace flashtune {

namespace fa1_simt_detail {

// Running state of one query block's rows in this thread: O_i (normalised), m_i, l_i.
template <class T>
struct RowState {
  float4 o[T::kTM][T::kOChunks];
  float m[T::kTM];
  float l[T::kTM];
};

// Load O_i, m_i, l_i of the rows this thread owns (fresh at the first K/V block; rows past
// seq_q stay fresh and are never stored).
template <class T>
__device__ __forceinline__ void load_state(RowState<T>& st, bool fresh, const float* o_g, const float* m_g,
                                           const float* l_g, int row0, int seq_q, int tx) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    const int i = row0 + a * T::kTR;
    const bool read = !fresh && i < seq_q;
    st.m[a] = read ? m_g[i] : neg_inf();
    st.l[a] = read ? l_g[i] : 0.f;
    const float* orow = o_g + static_cast<long long>(i) * T::kHeadDim + 4 * tx;
#pragma unroll
    for (int e = 0; e < T::kOChunks; ++e)
      st.o[a][e] = read ? *reinterpret_cast<const float4*>(orow + 4 * T::kTC * e) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Scores to the exp2 domain; -inf where key j is past seq_k or (causal) j > i + causal_offset.
template <class T>
__device__ __forceinline__ void scale_and_mask(float (&s)[T::kTM][T::kTN], float scale_log2, bool needs_mask,
                                               int row0, int col0, int seq_k, int causal_offset) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    const int i = row0 + a * T::kTR;
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) {
      const int j = col0 + b * T::kTC;
      const bool masked = needs_mask && (j >= seq_k || (T::kCausal && j > i + causal_offset));
      s[a][b] = masked ? neg_inf() : s[a][b] * scale_log2;
    }
  }
}

// S -> P = exp2(S - m_new) in place; l = alpha*l + rowsum(P) (full row, over the TC lanes);
// O *= alpha*l_old (O_i is normalised: back to its unnormalised weight in the new base).
// A row with no visible key so far keeps m = -inf: exponents use base 0 then, P = 0, alpha = 0.
template <class T>
__device__ __forceinline__ void softmax_update(float (&s)[T::kTM][T::kTN], RowState<T>& st) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    float mx = s[a][0];
#pragma unroll
    for (int b = 1; b < T::kTN; ++b) mx = fmaxf(mx, s[a][b]);
    const float m_new = fmaxf(st.m[a], group_max<T::kTC>(mx));
    const float base = (m_new == neg_inf()) ? 0.f : m_new;
    const float alpha = fast_exp2(st.m[a] - base);
    float rs = 0.f;
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) {
      s[a][b] = fast_exp2(s[a][b] - base);
      rs += s[a][b];
    }
    const float keep = alpha * st.l[a];  // weight of the old O_i
    st.l[a] = keep + group_sum<T::kTC>(rs);
    st.m[a] = m_new;
#pragma unroll
    for (int e = 0; e < T::kOChunks; ++e) {
      st.o[a][e].x *= keep;
      st.o[a][e].y *= keep;
      st.o[a][e].z *= keep;
      st.o[a][e].w *= keep;
    }
  }
}

template <class T>
__device__ __forceinline__ void store_p(const float (&s)[T::kTM][T::kTN], float* Ps, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a)
#pragma unroll
    for (int b = 0; b < T::kTN; ++b) Ps[(ty + a * T::kTR) * T::kPStride + tx + b * T::kTC] = s[a][b];
}

// O_i /= l_new and write it back with m, l; after Q_i's last K/V block write LSE instead of m, l.
// A row that saw no key: O = 0, LSE = +inf.
template <class T>
__device__ __forceinline__ void store_state(RowState<T>& st, bool last, float* o_g, float* m_g, float* l_g,
                                            float* lse_g, int row0, int seq_q, int tx) {
#pragma unroll
  for (int a = 0; a < T::kTM; ++a) {
    const int i = row0 + a * T::kTR;
    if (i >= seq_q) continue;
    const float l = st.l[a];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float* orow = o_g + static_cast<long long>(i) * T::kHeadDim + 4 * tx;
#pragma unroll
    for (int e = 0; e < T::kOChunks; ++e) {
      const float4 r = st.o[a][e];
      *reinterpret_cast<float4*>(orow + 4 * T::kTC * e) = make_float4(r.x * inv, r.y * inv, r.z * inv, r.w * inv);
    }
    if (tx == 0) {
      if (last) {
        lse_g[i] = l > 0.f ? (st.m[a] + fast_log2(l)) * kLn2 : pos_inf();
      } else {
        m_g[i] = st.m[a];
        l_g[i] = l;
      }
    }
  }
}

}  // namespace fa1_simt_detail

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) fa1_simt_fwd(const AttnFwdParams p) {
  using T = Traits;
  namespace det = fa1_simt_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int TM = T::kTM;
  constexpr int TC = T::kTC;
  constexpr int NT = T::kThreads;
  constexpr int RS = T::kRowStride;
  constexpr int QSPLIT = T::kQSplit;
  constexpr bool CAUSAL = T::kCausal;
  check_dynamic_smem(T::kSmemBytes);

  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;             // [BN][D+4]
  float* Vs = Ks + BN * RS;     // [BN][D+4]
  float* Ps = Vs + BN * RS;     // [BM][BN+4]
  float* Qbuf = Ps + BM * T::kPStride;  // Q_STAGES x [BM][D+4]
  auto q_tile = [&](int t) { return Qbuf + (T::kQStages == 2 ? (t & 1) : 0) * BM * RS; };

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int tx = lane % TC;
  const int ty = (tid >> 5) * (32 / TC) + lane / TC;

  const int seq_q = p.seq_q;
  const int seq_k = p.seq_k;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const long long rows_all = static_cast<long long>(p.batch) * p.heads * seq_q;
  const float* q = static_cast<const float*>(p.q) + bh * seq_q * D;
  const float* k = static_cast<const float*>(p.k) + bh * seq_k * D;
  const float* v = static_cast<const float*>(p.v) + bh * seq_k * D;
  float* o_g = static_cast<float*>(p.o) + bh * seq_q * D;
  float* lse_g = p.lse + bh * seq_q;
  float* m_g = p.workspace + bh * seq_q;
  float* l_g = p.workspace + rows_all + bh * seq_q;

  // Key j is visible to query i iff j <= i + causal_offset (bottom-right aligned).
  const int causal_offset = seq_k - seq_q;
  const int num_q_blocks = (seq_q + BM - 1) / BM;
  // K/V blocks some row of query block qb can see: a prefix [0, kv_blocks_of(qb)), growing with qb.
  auto kv_blocks_of = [&](int qb) {
    int kv_end = seq_k;
    if (CAUSAL) kv_end = imin(seq_k, imin((qb + 1) * BM, seq_q) + causal_offset);
    return kv_end > 0 ? (kv_end + BN - 1) / BN : 0;
  };

  // This CTA's query blocks: g, g + QSPLIT, ... Those that see no key (causal, seq_q > seq_k)
  // are never visited below: O = 0, LSE = +inf here.
  const int g = blockIdx.x;
  int qb_seen = g;
  for (; qb_seen < num_q_blocks && kv_blocks_of(qb_seen) == 0; qb_seen += QSPLIT) {
    const int r0 = qb_seen * BM, rows = imin(BM, seq_q - r0);
    for (int idx = tid; idx < rows * D; idx += NT) o_g[static_cast<long long>(r0) * D + idx] = 0.f;
    for (int r = tid; r < rows; r += NT) lse_g[r0 + r] = pos_inf();
  }
  if (qb_seen >= num_q_blocks) return;  // uniform: before any barrier
  const int last_qb = g + QSPLIT * ((num_q_blocks - 1 - g) / QSPLIT);
  const int num_kv_blocks = kv_blocks_of(last_qb);  // the last query block sees the most keys

  for (int j = 0; j < num_kv_blocks; ++j) {
    const int n0 = j * BN;
    int qb = qb_seen;  // first of our query blocks that sees K/V block j (causal: skip the rest)
    while (kv_blocks_of(qb) <= j) qb += QSPLIT;

    __syncthreads();  // everyone done with K_{j-1}, V_{j-1}, Qs, Ps
    cp_async_rows_f32<BN, D, RS, NT>(Ks, k, n0, seq_k, tid);
    cp_async_rows_f32<BN, D, RS, NT>(Vs, v, n0, seq_k, tid);
    cp_async_rows_f32<BM, D, RS, NT>(q_tile(0), q, qb * BM, seq_q, tid);
    cp_async_commit();

    for (int t = 0; qb < num_q_blocks; qb += QSPLIT, ++t) {
      const int m0 = qb * BM;
      const bool has_next = qb + QSPLIT < num_q_blocks;
      const float* Qs = q_tile(t);
      cp_async_wait<0>();
      __syncthreads();  // Q_i (and K_j, V_j) visible; everyone done with the previous step's Ps
      if (T::kQStages == 2 && has_next) cp_async_rows_f32<BM, D, RS, NT>(q_tile(t + 1), q, m0 + QSPLIT * BM, seq_q, tid);
      cp_async_commit();

      // O_i, m_i, l_i from global memory (their latency hides behind S = Q_i K_j^T).
      det::RowState<T> st;
      det::load_state<T>(st, j == 0, o_g, m_g, l_g, m0 + ty, seq_q, tx);

      // S = Q_i K_j^T, masked only on blocks straddling the seq_k end or the diagonal.
      float s[TM][T::kTN];
      tile_a_bt<TM, T::kTN, D, T::kTR, TC, RS, RS>(s, Qs, Ks, ty, tx);
      const bool needs_mask = (n0 + BN > seq_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset);
      det::scale_and_mask<T>(s, p.scale_log2, needs_mask, m0 + ty, n0 + tx, seq_k, causal_offset);

      // m_new, P = exp(S - m_new), l_new; O_i rescaled to the new base.
      det::softmax_update<T>(s, st);
      det::store_p<T>(s, Ps, ty, tx);
      __syncthreads();  // P visible; everyone done reading Qs
      if (T::kQStages == 1 && has_next) cp_async_rows_f32<BM, D, RS, NT>(q_tile(0), q, m0 + QSPLIT * BM, seq_q, tid);
      cp_async_commit();

      // O_i = (alpha l_i O_i + P V_j) / l_new, written back with m, l (or LSE after the last K/V block).
      accumulate_p_x<TM, T::kOChunks, BN, T::kTR, TC, T::kPStride, RS>(st.o, Ps, Vs, ty, tx);
      det::store_state<T>(st, j == kv_blocks_of(qb) - 1, o_g, m_g, l_g, lse_g, m0 + ty, seq_q, tx);
    }
  }
}

}  // namespace flashtune
