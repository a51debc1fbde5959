// FlashAttention-2 backward on Hopper's warpgroup MMA (wgmma, sm_90a), fp16 or bf16 in and out,
// fp32 accumulation. Kernels, launched in order (T = Fa2WgmmaBwdTraits<D, BLOCK_M, BLOCK_N, SPLIT,
// STAGES, DQ_RED, LOAD, DTYPE, CAUSAL, DETERMINISTIC, SCHED>):
//   fa2_wgmma_bwd_preprocess<T>  delta = rowsum(dO * O), dq_accum = 0; LOAD 1: the tile images of Q, dO,
//                                lse, delta that the dK/dV kernel bulk-copies
//   fa2_wgmma_bwd_dkdv<T>        one CTA per K/V block j of a kv head: dK_j, dV_j; dq_accum += scale dS K_j
//   fa2_mma_bwd_dq<T>            dQ = 16-bit(dq_accum)                        (shared with fa2_mma_bwd)
// The preprocess and the dQ conversion run per query head; the dK/dV kernel per kv head (grouped-query
// attention, AttnBwdParams::heads_k: its loop visits the query blocks of every query head of the group
// as one sequence of steps, so dK, dV are summed over the group in registers and stored once: no
// atomics on them, deterministic; dQ goes to each step's query head).
//
// dK/dV kernel, per query block i (Q_i, dO_i, lse_i, delta_i by cp.async or, LOAD 1, bulk copies;
// STAGES = 2: block i+1 lands during block i). Scores are held transposed (keys x queries) so that a warpgroup's score
// rows are its dK/dV rows, as in fa2_mma_bwd, but every product is one wgmma chain per warpgroup:
//   S^T  = K_j Q_i^T      SS: A = K (K-major), B = Q (K-major)              m64 x BM, k = D
//   dP^T = V_j dO_i^T     SS: A = V, B = dO                                 m64 x BM, k = D
//   P^T  = exp2(S^T scale_log2 - lse log2 e), dS^T = P^T (dP^T - delta)   in registers, per query column
//   dV  += P^T dO_i       RS: A = P^T packed from the accumulators, B = dO (MN-major)   m64 x D, k = BM
//   dK  += dS^T Q_i       RS: A = dS^T packed, B = Q (MN-major)                         m64 x D, k = BM
//   dS^T -> shared memory; barrier
//   dQ_i += dS K_j        SS: A = dS (M-major view of dS^T), B = K (MN-major)  m64 x D/NQ per warpgroup
//                         then fp32 reductions into dq_accum
// SPLIT 0: each warpgroup owns 64 keys and runs all of the above. SPLIT 1 (d >= 192): two warpgroups
// share 64 keys; warpgroup 0 runs S^T, P^T (handed over through shared memory, named barrier 1) and
// dV; warpgroup 1 runs dP^T, dS^T and dK; both take a piece of dQ. SPLIT 2 (d >= 128): two
// warpgroups share 64 keys and halve every product along N: S^T, dP^T over half the queries each,
// P^T and dS^T (16-bit) exchanged through shared memory, dV += P^T dO and dK += dS^T Q over half the
// D columns each with both operands from shared memory (SS), then a piece of dQ.
// Shared-memory tiles use the interleaved core-matrix layout of wgmma_common.cuh (no swizzle).
//
// Packed variable-length batches: kernel<T, true> (VarlenParams: cu_seqlens_q/k) take their sequence's
// lengths and offsets (VarlenSeq, z = the sequence; the dK/dV kernel's SCHED 3: its pair's) with fa2_mma_bwd's
// layouts: token-major rows of H*D (Hk*D) elements, lse and delta (H, total_q), dq_accum laid out like dQ. A
// CTA whose block starts past its sequence's end exits; keys of a sequence without queries get dK = dV = 0 (no
// step). LOAD 1's images hold each sequence's padded blocks from a 16-row aligned start
// (fa2_wgmma_bwd_varlen_seq_row); DQ_RED 3 reduces its block's tile one row per lane of warp 0 (the rows are H*D
// apart in dq_accum).
//
// Masking as fa2_mma_bwd: padded rows are zero-filled (lse, delta too), so a padded query
// contributes exactly zero; keys past seq_k and causal keys k > q + seq_k - seq_q get P = 0 on
// tiles that straddle them; a fully masked row has lse = +inf: P = 0.
#pragma once
#include "fa2_mma_bwd.cuh"
#include "fa2_wgmma_bwd_traits.h"
#include "wgmma_common.cuh"

namespace flashtune {

namespace fa2_wgmma_bwd_detail {

// Rows [row0, row0+ROWS) of a (seq, D) 16-bit matrix with rows `stride` elements apart (packed: H*D or
// Hk*D) into an interleaved tile by 16-byte cp.async.
// Thread order: row within the 8-row group fastest, then chunk, then row group, so 8 consecutive
// threads fill one 128-byte core matrix. Rows >= seq are zero-filled.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows_il(unsigned dst, const unsigned short* src, int row0, int seq, int tid,
                                             int stride = D) {
  constexpr int CPR = D / 8;
  constexpr int kChunks = ROWS * CPR;
#pragma unroll
  for (int it = 0; it < ceil_div(kChunks, NT); ++it) {
    const int idx = tid + it * NT;
    if (kChunks % NT == 0 || idx < kChunks) {
      const int r = (idx & 7) + 8 * (idx / (8 * CPR));
      const int c = (idx >> 3) % CPR;
      const int grow = row0 + r;
      const bool ok = grow < seq;
      cp_async_16_s(dst + il_chunk<D>(r, c), ok ? src + static_cast<long long>(grow) * stride + 8 * c : src, ok ? 16 : 0);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = 0.f;
}

// acc (64 x N) = X Y^T over K columns: X rows from a K-major tile at x_addr, Y rows (N of them)
// from a K-major tile at y_addr; both tiles have K columns.
template <int N, int K, int DTYPE>
__device__ __forceinline__ void gemm_abt(float (&acc)[N / 2], unsigned x_addr, unsigned y_addr) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_ss<N, DTYPE, 0, 0>(acc, desc_k_major<K>(x_addr + 256 * kk), desc_k_major<K>(y_addr + 256 * kk), kk > 0);
}

// acc (64 x N) += C Y: C (64 x K) as 16-bit A fragments (one per k16 slice, packed before the
// wgmma_fence so that no register is written inside the issue sequence), Y (K x N) the rows of an
// N-column tile at y_addr (MN-major).
template <int N, int K, int DTYPE>
__device__ __forceinline__ void gemm_frags_by_tile(float (&acc)[N / 2], const unsigned (&c)[K / 16][4], unsigned y_addr) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_rs<N, DTYPE, 1>(acc, c[kk], desc_mn_major<N>(y_addr + 32 * N * kk), 1);
}

// P^T in place of S^T (64 x BM, this thread's elements) for the warpgroup tile whose rows are keys
// key0 + g (+8) and the query block starting at m0.
template <int BM>
__device__ __forceinline__ void probs(float (&st)[BM / 2], const float* lse_s, float scale_log2, bool needs_mask,
                                      int key0, int m0, int seq_k, int causal_offset, bool causal, int g, int tig) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * j + 2 * tig);
    const float nl[2] = {-l2.x * kLog2e, -l2.y * kLog2e};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = fast_exp2(fmaf(st[4 * j + e], scale_log2, nl[e & 1]));
      if (needs_mask) {
        const int n = key0 + g + 8 * (e >> 1);
        const int m = m0 + 8 * j + 2 * tig + (e & 1);
        if (n >= seq_k || (causal && n > m + causal_offset)) pv = 0.f;
      }
      st[4 * j + e] = pv;
    }
  }
}

// dS^T = P^T (dP^T - delta) in place of dP^T; P^T element e of n8 tile j from pt(j, e).
template <int BM, class PT>
__device__ __forceinline__ void dscores(float (&dpt)[BM / 2], PT pt, const float* dl_s, int tig) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const float2 d2 = *reinterpret_cast<const float2*>(dl_s + 8 * j + 2 * tig);
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[4 * j + e] = pt(j, e) * (dpt[4 * j + e] - ((e & 1) ? d2.y : d2.x));
  }
}

// DQ_RED 2: a warp's 16 x C piece of dQ (accumulators in the C layout, times mul) added into rows
// 0..15 of out (row stride `stride`: D, packed H*D; rows >= rows_left skipped), 32 columns at a time through the warp's
// 16 x 32 fp32 staging tile: stored in 16-byte pieces swizzled by row (piece c4 of row r at
// c4 ^ (r % 8): conflict free), read back 8 lanes per row, so that every red.v4 instruction of the
// warp covers four whole 128-byte rows (instead of 8 rows x 32 bytes from the C layout).
template <int C, int D, int N>
__device__ __forceinline__ void reduce_staged(float* stage, const float (&acc)[N], float mul, float* out, int rows_left,
                                              int lane, int stride = D) {
  static_assert(C % 32 == 0 && N == C / 2, "dQ chunks of a multiple of 32 columns");
  const int g = lane >> 2, tig = lane & 3;
  const int rr = lane >> 3, c4 = lane & 7;  // read-back: row rr (+4, +8, +12), 16-byte piece c4
#pragma unroll
  for (int c32 = 0; c32 < C / 32; ++c32) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        const float* x = acc + 16 * c32 + 4 * j + 2 * h;
        *reinterpret_cast<float2*>(stage + 32 * r + 4 * ((2 * j + (tig >> 1)) ^ (r & 7)) + 2 * (tig & 1)) =
            make_float2(x[0] * mul, x[1] * mul);
      }
    __syncwarp();
#pragma unroll 1  // one row in flight: keeps the registers of d = 256 (dK, dV, dQ chunk) spill-free
    for (int r = rr; r < 16; r += 4) {
      const float4 v = *reinterpret_cast<const float4*>(stage + 32 * r + 4 * (c4 ^ (r & 7)));
      if (r < rows_left) red_add_f32x4(out + static_cast<long long>(r) * stride + 32 * c32 + 4 * c4, v);
    }
    __syncwarp();  // read before the next piece overwrites it
  }
}

// LOAD 1's images in p.workspace (traits: fa2_wgmma_bwd_workspace_bytes), for (batch, query head) bh with
// R = seq_q rounded up to BM rows: Q and dO as [R/BM] interleaved [BM][D] tiles, lse and delta [R]. The
// heads of a group are consecutive, so block mb of the group's query head hq is block hq R/BM + mb from
// its first head's images.
struct Images {
  unsigned short* q;
  unsigned short* dout;
  float* lse;
  float* delta;
};
template <class T>
__device__ __forceinline__ Images images(const AttnBwdParams& p, long long bh) {
  if constexpr (T::kLoad != 1) {
    return Images{};
  } else {
    const long long rows = fa2_wgmma_bwd_padded_rows(p.seq_q, T::kBlockM);
    const long long bhs = static_cast<long long>(p.batch) * p.heads;
    unsigned short* base = static_cast<unsigned short*>(p.workspace);
    float* stats = reinterpret_cast<float*>(base + 2 * bhs * rows * T::kHeadDim);
    return Images{base + bh * rows * T::kHeadDim, base + (bhs + bh) * rows * T::kHeadDim, stats + bh * rows,
                  stats + (bhs + bh) * rows};
  }
}
// Packed: the images of query head h from sequence b's first padded row (vs: sequence b), every head
// fa2_wgmma_bwd_varlen_head_rows rows (the heads of a group are consecutive here too).
template <class T>
__device__ __forceinline__ Images images_packed(const AttnBwdParams& p, const VarlenSeq& vs, int h, int b) {
  if constexpr (T::kLoad != 1) {
    return Images{};
  } else {
    const long long rows = fa2_wgmma_bwd_varlen_head_rows(vs.total_q, p.batch, T::kBlockM);
    const long long at = h * rows + fa2_wgmma_bwd_varlen_seq_row(vs.q_tok0, b, T::kBlockM);
    const long long hs = p.heads;
    unsigned short* base = static_cast<unsigned short*>(p.workspace);
    float* stats = reinterpret_cast<float*>(base + 2 * hs * rows * T::kHeadDim);
    return Images{base + at * T::kHeadDim, base + (hs * rows + at) * T::kHeadDim, stats + at, stats + hs * rows + at};
  }
}

// DETERMINISTIC's turn counters in p.workspace, after LOAD 1's images (traits: fa2_wgmma_bwd_turns_bytes):
// laid out as lse and delta, query block m's counter at its first row (vs: the sequence, packed).
template <class T, bool VARLEN>
__device__ __forceinline__ int* turn_counters(const AttnBwdParams& p, const VarlenSeq& vs) {
  constexpr int D = T::kHeadDim, BM = T::kBlockM, LOAD = T::kLoad;
  const long long images = VARLEN ? fa2_wgmma_bwd_varlen_images_bytes(p.batch, p.heads, vs.total_q, D, BM, LOAD)
                                  : fa2_wgmma_bwd_images_bytes(p.batch, p.heads, p.seq_q, D, BM, LOAD);
  return reinterpret_cast<int*>(static_cast<unsigned char*>(p.workspace) + images);
}

// The dK/dV CTA's key block, kv head and batch (packed: sequence) from its block index (fa2_wgmma_bwd_work: SCHED 0
// x, y, z; SCHED 1 and 3 the pair in its group, key block on y); a CTA past the last pair has batch >= p.batch. Each field
// is read where it is used, so that SCHED 0 reads blockIdx where the kernel always did and compiles as before (the
// three taken at the top moved blockIdx.y ahead of the packed sequence's loads: 16 bytes spilled at packed d 128).
template <class T>
struct Work {
  int kv_heads;
  __device__ __forceinline__ explicit Work(const AttnBwdParams& p) : kv_heads(p.heads_k > 0 ? p.heads_k : p.heads) {}
  __device__ __forceinline__ unsigned key_block() const { return at().key_block; }
  __device__ __forceinline__ unsigned kv_head() const { return at().kv_head; }
  __device__ __forceinline__ unsigned batch() const { return at().batch; }

 private:
  __device__ __forceinline__ Fa2WgmmaBwdWork at() const {
    return fa2_wgmma_bwd_work(T::kSched, T::kDeterministicOrder, kv_heads, blockIdx, gridDim);
  }
};

}  // namespace fa2_wgmma_bwd_detail

// delta = rowsum(dO * O) and dq_accum = 0 for rows < seq_q, as fa2_mma_bwd_preprocess; LOAD 1 also
// writes the images, zeros for the rows from seq_q up to the next multiple of BM (packed: per sequence);
// DETERMINISTIC zeroes each query block's turn counter.
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kPreThreads)
    fa2_wgmma_bwd_preprocess(const typename ParamsOf<VARLEN, AttnBwdParams>::type p) {
  using T = Traits;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int L = T::kRowLanes;
  check_dynamic_smem(T::kPreSmemBytes);
  const int tid = threadIdx.x;
  const int g = tid % L;
  const int row = blockIdx.x * T::kRowsPerCta + tid / L;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, blockIdx.z);
  const int seq_q = VARLEN ? vs.seq_q : p.seq_q;
  const bool ok = row < seq_q;
  const long long off = VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) + static_cast<long long>(row) * p.heads * D
                               : (bh * p.seq_q + row) * D;
  const long long stat = VARLEN ? vs.lse_offset(blockIdx.y) + row : bh * p.seq_q + row;  // lse, delta
  const auto img = VARLEN ? fa2_wgmma_bwd_detail::images_packed<T>(p, vs, blockIdx.y, blockIdx.z)
                          : fa2_wgmma_bwd_detail::images<T>(p, bh);
  const int blk = row / BM, rb = row % BM;  // LOAD 1: this row's tile and row within it
  // LOAD 1, packed: only this sequence's padded blocks (the grid covers the longest sequence's): unguarded,
  // a shorter sequence's zero rows past its padding landed on the next sequence's (or head's) images, racing
  // with that sequence's own writes (the H100's invalid packed LOAD 1 runs). Dense: every row of the grid.
  const bool img_row = !VARLEN || fa2_wgmma_bwd_image_row(row, seq_q, BM);
  float acc = 0.f;
#pragma unroll
  for (int c = g; c < D / 8; c += L) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint4 ov = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.o) + off + 8 * c) : zero;
    const uint4 dv = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.dout) + off + 8 * c) : zero;
    acc = dot_chunk<T::kDtype>(dv, ov, acc);
    if constexpr (T::kLoad == 1) {
      if (img_row) {
        const uint4 qv = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.q) + off + 8 * c) : zero;
        const long long at = static_cast<long long>(blk) * BM * D + il_chunk<D>(rb, c) / 2;  // in 16-bit elements
        *reinterpret_cast<uint4*>(img.q + at) = qv;
        *reinterpret_cast<uint4*>(img.dout + at) = dv;
      }
    }
  }
  if (ok) {
#pragma unroll
    for (int c = g; c < D / 4; c += L)
      *reinterpret_cast<float4*>(p.dq_accum + off + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  acc = group_sum<L>(acc);  // every lane takes part (no early exit before the shuffles)
  if (g == 0) {
    if (ok) p.delta[stat] = acc;
    if (T::kLoad == 1 && fa2_wgmma_bwd_image_row(row, seq_q, BM)) {
      img.delta[row] = ok ? acc : 0.f;
      img.lse[row] = ok ? p.lse[stat] : 0.f;
    }
    if constexpr (T::kDeterministic) {
      if (ok && rb == 0) fa2_wgmma_bwd_detail::turn_counters<T, VARLEN>(p, vs)[stat] = 0;
    }
  }
}

namespace fa2_wgmma_bwd_detail {

// The dK/dV kernel's shared memory, in bytes from its base (k):
//   K, V [BN][D] | STAGES x {Q, dO} [BM][D] | dS^T [BN][BM] | P^T (SPLIT 1, 2) | STAGES x {lse, delta} [BM]
//   | the dQ staging (DQ_RED 1, 2) | one mbarrier per stage (LOAD 1)
// The pieces below hold it by value (a pointer and an address, both constants after inlining).
template <class T>
struct DkdvSmem {
  static constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN;
  static constexpr int kV = 2 * BN * D;
  static constexpr int kQdo = kV + 2 * BN * D;
  static constexpr int kDs = kQdo + T::kStages * 4 * BM * D;
  static constexpr int kP = kDs + 2 * BN * BM;  // SPLIT 1: fp32 (float4 slot q of thread t at (q*128+t)*16), SPLIT 2: 16-bit [64][BM]
  static constexpr int kStats = kP + fa2_wgmma_bwd_p_bytes(BM, T::kSplit);
  static constexpr int kDqStage = kStats + 8 * T::kStages * BM;  // DQ_RED 1: dQ tile [BM][D + 8] fp32; 2: per warp [16][32]
  static constexpr int kBars = kDqStage + fa2_wgmma_bwd_dq_stage_bytes(D, BM, BN, T::kSplit, T::kDqRed);

  unsigned char* base;
  unsigned k;  // shared-space address of the base
  // The address arithmetic below is written as the single-function kernel wrote it (same operand order
  // and types), so that the optimiser sees the same expressions.
  __device__ __forceinline__ unsigned v() const { return k + kV; }
  __device__ __forceinline__ unsigned q(int s) const { return k + kQdo + static_cast<unsigned>(s * 4 * BM * D); }
  __device__ __forceinline__ unsigned dout(int s) const {
    return k + kQdo + static_cast<unsigned>(s * 4 * BM * D + 2 * BM * D);
  }
  __device__ __forceinline__ unsigned ds() const { return k + kDs; }
  __device__ __forceinline__ unsigned pt() const { return k + kP; }
  __device__ __forceinline__ unsigned stats(int s) const { return k + kStats + 8 * s * BM; }  // lse, then delta
  __device__ __forceinline__ const float* lse(int s) const {
    return reinterpret_cast<const float*>(base + kStats) + 2 * s * BM;
  }
  __device__ __forceinline__ unsigned bar(int s) const { return k + static_cast<unsigned>(kBars + 8 * s); }
  __device__ __forceinline__ float* dq_stage() const { return reinterpret_cast<float*>(base + kDqStage); }
  template <class X>
  __device__ __forceinline__ X* at(unsigned addr) const { return reinterpret_cast<X*>(base + (addr - k)); }
};

// One step of the dK/dV loop (query block mb of query head hq of the kv head's group) and their sequence
// (traits header: host-usable, unit-tested).
using QueryStep = Fa2WgmmaBwdQueryStep;
using QuerySteps = Fa2WgmmaBwdQuerySteps;

// ---- LOAD: how a query block's Q, dO, lse and delta reach their stage ---------------------------------
// bh: the group's first query head (dense). Packed: the group's first query head of the CTA's sequence,
// taken from the params and the CTA's work (Work<T>) by the loader itself (the dense one's constructor unchanged
// keeps its SASS: with the sequence passed in, ptxas allocated the LOAD 0 kernels differently).
template <class T, bool VARLEN, int LOAD = T::kLoad>
struct BlockLoader;

// LOAD 0: 16-byte cp.async by every thread from the inputs (rows past seq_q zero-filled); complete at
// the main loop's cp_async_wait.
template <class T>
struct BlockLoader<T, false, 0> {
  DkdvSmem<T> sm;
  const unsigned short *q, *dout;
  const float *lse, *delta;
  int seq_q, tid;
  __device__ __forceinline__ BlockLoader(const DkdvSmem<T>& sm_, const AttnBwdParams& p, long long bh, int tid_)
      : sm(sm_), q(static_cast<const unsigned short*>(p.q) + bh * p.seq_q * T::kHeadDim),
        dout(static_cast<const unsigned short*>(p.dout) + bh * p.seq_q * T::kHeadDim), lse(p.lse + bh * p.seq_q),
        delta(p.delta + bh * p.seq_q), seq_q(p.seq_q), tid(tid_) {}
  __device__ __forceinline__ void init(const AttnBwdParams&, long long) const {}
  __device__ __forceinline__ void load(const QueryStep& st, int s) const {
    constexpr int BM = T::kBlockM, D = T::kHeadDim, NT = T::kDkdvThreads;
    const long long h = static_cast<long long>(st.hq) * seq_q;  // the rows of the group's heads before it
    load_rows_il<BM, D, NT>(sm.q(s), q + h * D, st.mb * BM, seq_q, tid);
    load_rows_il<BM, D, NT>(sm.dout(s), dout + h * D, st.mb * BM, seq_q, tid);
    fa2_mma_bwd_detail::load_stats<BM, NT>(sm.stats(s), sm.stats(s) + 4 * BM, lse + h, delta + h, st.mb * BM, seq_q,
                                           tid);
  }
  __device__ __forceinline__ void wait(int) {}
};

// LOAD 0, packed: the same from the sequence's rows of the group's first query head; the group's heads are
// D elements apart in a token's row (H*D), total_q apart in lse and delta.
template <class T>
struct BlockLoader<T, true, 0> {
  DkdvSmem<T> sm;
  const unsigned short *q, *dout;
  const float *lse, *delta;
  int seq_q, tid, q_stride;
  long long total_q;
  __device__ __forceinline__ BlockLoader(const DkdvSmem<T>& sm_, const VarlenParams<AttnBwdParams>& p, long long,
                                         int tid_)
      : BlockLoader(sm_, p, Work<T>(p), tid_) {}
  __device__ __forceinline__ BlockLoader(const DkdvSmem<T>& sm_, const VarlenParams<AttnBwdParams>& p, const Work<T>& w,
                                         int tid_)
      : BlockLoader(sm_, p, VarlenSeq::of<true>(p, w.batch()), w.kv_head() * query_group(p), tid_) {}
  __device__ __forceinline__ BlockLoader(const DkdvSmem<T>& sm_, const AttnBwdParams& p, const VarlenSeq& vs, int h0,
                                         int tid_)
      : sm(sm_), q(static_cast<const unsigned short*>(p.q) + vs.q_offset(p.heads, h0, T::kHeadDim)),
        dout(static_cast<const unsigned short*>(p.dout) + vs.q_offset(p.heads, h0, T::kHeadDim)),
        lse(p.lse + vs.lse_offset(h0)), delta(p.delta + vs.lse_offset(h0)), seq_q(vs.seq_q), tid(tid_),
        q_stride(p.heads * T::kHeadDim), total_q(vs.total_q) {}
  __device__ __forceinline__ void init(const AttnBwdParams&, long long) const {}
  __device__ __forceinline__ void load(const QueryStep& st, int s) const {
    constexpr int BM = T::kBlockM, D = T::kHeadDim, NT = T::kDkdvThreads;
    const long long h = static_cast<long long>(st.hq) * total_q;
    load_rows_il<BM, D, NT>(sm.q(s), q + st.hq * D, st.mb * BM, seq_q, tid, q_stride);
    load_rows_il<BM, D, NT>(sm.dout(s), dout + st.hq * D, st.mb * BM, seq_q, tid, q_stride);
    fa2_mma_bwd_detail::load_stats<BM, NT>(sm.stats(s), sm.stats(s) + 4 * BM, lse + h, delta + h, st.mb * BM, seq_q,
                                           tid);
  }
  __device__ __forceinline__ void wait(int) {}
};

// LOAD 1: bulk copies of the block's tile images (the preprocess wrote them, padded: no bounds) by one
// thread, completing phase t / STAGES of the stage's mbarrier.
template <class T, bool VARLEN>
struct BlockLoader<T, VARLEN, 1> {
  DkdvSmem<T> sm;
  Images img;
  int seq_q, tid;
  unsigned parity = 0;  // bit st: the parity of stage st's next phase
  long long head_rows = 0;  // packed: rows of a head's images
  __device__ __forceinline__ BlockLoader(const DkdvSmem<T>& sm_, const AttnBwdParams& p, long long, int tid_)
      : sm(sm_), img{}, seq_q(p.seq_q), tid(tid_) {}  // packed: seq_q unused
  // The images' addresses are taken here, not in the constructor: where the single-function kernel took them.
  template <class Params>
  __device__ __forceinline__ void init(const Params& p, long long bh) {
    if constexpr (VARLEN) {  // the CTA's sequence, its group's first query head
      const Work<T> w(p);
      const VarlenSeq vs = VarlenSeq::of<true>(p, w.batch());
      img = images_packed<T>(p, vs, w.kv_head() * query_group(p), w.batch());
      head_rows = fa2_wgmma_bwd_varlen_head_rows(vs.total_q, p.batch, T::kBlockM);
    } else {
      img = images<T>(p, bh);
    }
    if (tid == 0) {
      for (int st = 0; st < T::kStages; ++st) mbar_init(sm.bar(st), 1);
      fence_mbar_init();
    }
    __syncthreads();
  }
  __device__ __forceinline__ void load(const QueryStep& st, int s) const {
    constexpr int BM = T::kBlockM, D = T::kHeadDim;
    if (tid == 0) {
      // In the images; packed: the group's heads head_rows apart.
      const long long row0 = VARLEN ? static_cast<long long>(st.hq) * head_rows + st.mb * BM
                                    : (static_cast<long long>(st.hq) * ceil_div(seq_q, BM) + st.mb) * BM;
      mbar_arrive_expect_tx(sm.bar(s), 4 * BM * D + 8 * BM);
      bulk_load(sm.q(s), img.q + row0 * D, 2 * BM * D, sm.bar(s));
      bulk_load(sm.dout(s), img.dout + row0 * D, 2 * BM * D, sm.bar(s));
      bulk_load(sm.stats(s), img.lse + row0, 4 * BM, sm.bar(s));
      bulk_load(sm.stats(s) + 4 * BM, img.delta + row0, 4 * BM, sm.bar(s));
    }
  }
  __device__ __forceinline__ void wait(int s) {
    mbar_wait(sm.bar(s), (parity >> s) & 1u);
    parity ^= 1u << s;
  }
};

// ---- SPLIT: one query block's S^T, dP^T, P^T, dS^T and the dV, dK products ------------------------------
// In: the block's tiles (opaque addresses), lse and delta; out: dV, dK accumulated (products committed,
// not waited for) and dS^T (16-bit) in shared memory for the dQ product. scores_done() runs where the
// block's scores are in registers: DQ_RED 3 frees the other stage there (dq_holds_other_slot) and, in
// SPLIT 2, it is the barrier after P^T and dS^T reach shared memory. The score registers (Scores) are
// declared by the caller in its loop body: declared inside run(), the inlined arrays let the optimiser
// hoist the loop's address arithmetic out of it (issue 14: +12 registers on SPLIT 1, DQ_RED 2).
struct BlockTiles {
  const float *lse, *delta;
  unsigned k, v, q, dout, ds, pt;
  int key0;  // this thread's keys: key0 + g, key0 + g + 8
  bool needs_mask;
};

template <class T, int SPLIT = T::kSplit>
struct ComputeStep;

// The per-thread values every ComputeStep reads. kv_off: bytes from the K, V tiles to this warpgroup's
// keys (2 kr0 D), computed by the kernel: computed in run(), it is simplified apart from the kernel's
// kr0 = 64 wg and cost SPLIT 0 a register (and at d = 128, STAGES 1, LOAD 1 a spill).
struct StepArgs {
  float scale_log2;
  int m0, seq_k, causal_offset, kr0, wrow, wg, wtid, g, tig, kv_off;
};

// SPLIT 0: each warpgroup owns 64 keys and runs every product; ga = dV, gb = dK.
template <class T>
struct ComputeStep<T, 0> {
  static constexpr int D = T::kHeadDim, BM = T::kBlockM, DT = T::kDtype;
  static constexpr int GA = D / 2, GB = D / 2;
  struct Scores {
    float st[BM / 2], dpt[BM / 2];  // S^T -> P^T, dP^T -> dS^T
  };
  template <class ScoresDone>
  __device__ __forceinline__ static void run(const BlockTiles& b, const StepArgs& a, Scores& sc, float (&ga)[GA],
                                             float (&gb)[GB], ScoresDone scores_done) {
    float(&st)[BM / 2] = sc.st;
    float(&dpt)[BM / 2] = sc.dpt;
    wgmma_fence_regs(st);
    wgmma_fence_regs(dpt);
    wgmma_fence();
    gemm_abt<BM, D, DT>(st, b.k + a.kv_off, b.q);
    gemm_abt<BM, D, DT>(dpt, b.v + a.kv_off, b.dout);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(st);
    wgmma_fence_regs(dpt);
    scores_done();

    probs<BM>(st, b.lse, a.scale_log2, b.needs_mask, b.key0, a.m0, a.seq_k, a.causal_offset, T::kCausal, a.g, a.tig);
    dscores<BM>(dpt, [&](int j, int e) { return st[4 * j + e]; }, b.delta, a.tig);
    unsigned p_a[BM / 16][4], ds_a[BM / 16][4];
    pack_all<DT, BM>(p_a, st);
    pack_all<DT, BM>(ds_a, dpt);
    wgmma_fence_regs(ga);
    wgmma_fence_regs(gb);
    wgmma_fence();
    gemm_frags_by_tile<D, BM, DT>(ga, p_a, b.dout);  // dV += P^T dO
    gemm_frags_by_tile<D, BM, DT>(gb, ds_a, b.q);    // dK += dS^T Q
    wgmma_commit();
    store_a_frags<BM>(b.ds, ds_a, a.kr0 + a.wrow + a.g, a.tig);
  }
};

// SPLIT 1 (d >= 192): two warpgroups share 64 keys; warpgroup 0 runs S^T, P^T (handed over through
// shared memory, named barrier 1, fp32 at pt_f32) and dV; warpgroup 1 dP^T, dS^T and dK; ga is that
// gradient.
template <class T>
struct ComputeStep<T, 1> {
  static constexpr int D = T::kHeadDim, BM = T::kBlockM, DT = T::kDtype;
  static constexpr int GA = D / 2, GB = 2;
  struct Scores {
    unsigned ds_a[BM / 16][4];  // warpgroup 1: dS^T as 16-bit A fragments, stored after both branches
    float x[BM / 2];            // warpgroup 0: S^T -> P^T; warpgroup 1: dP^T -> dS^T
  };
  template <class ScoresDone>
  __device__ __forceinline__ static void run(const BlockTiles& b, const StepArgs& a, Scores& sc, float (&ga)[GA],
                                             float (&)[GB], ScoresDone scores_done, float4* pt_f32) {
    unsigned(&ds_a)[BM / 16][4] = sc.ds_a;
    float(&x)[BM / 2] = sc.x;
    wgmma_fence_regs(x);
    wgmma_fence();
    gemm_abt<BM, D, DT>(x, (a.wg == 0 ? b.k : b.v), (a.wg == 0 ? b.q : b.dout));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(x);
    scores_done();
    if (a.wg == 0) {
      probs<BM>(x, b.lse, a.scale_log2, b.needs_mask, b.key0, a.m0, a.seq_k, a.causal_offset, T::kCausal, a.g, a.tig);
#pragma unroll
      for (int qd = 0; qd < BM / 8; ++qd)
        pt_f32[qd * 128 + a.wtid] = make_float4(x[4 * qd], x[4 * qd + 1], x[4 * qd + 2], x[4 * qd + 3]);
      named_bar_arrive(1, 256);  // P^T ready for warpgroup 1
      unsigned p_a[BM / 16][4];
      pack_all<DT, BM>(p_a, x);
      wgmma_fence_regs(ga);
      wgmma_fence();
      gemm_frags_by_tile<D, BM, DT>(ga, p_a, b.dout);  // dV += P^T dO
      wgmma_commit();
    } else {
      named_bar_sync(1, 256);
      const float4* pt = pt_f32;
      dscores<BM>(x, [&](int j, int e) { return reinterpret_cast<const float*>(pt + j * 128 + a.wtid)[e]; }, b.delta,
                  a.tig);
      pack_all<DT, BM>(ds_a, x);
      wgmma_fence_regs(ga);
      wgmma_fence();
      gemm_frags_by_tile<D, BM, DT>(ga, ds_a, b.q);  // dK += dS^T Q
      wgmma_commit();
    }
    if (a.wg == 1) store_a_frags<BM>(b.ds, ds_a, a.kr0 + a.wrow + a.g, a.tig);
  }
};

// SPLIT 2 (d >= 128): two warpgroups share 64 keys and halve every product along N: S^T, dP^T over
// half the queries each, P^T and dS^T (16-bit) exchanged through shared memory, dV += P^T dO and
// dK += dS^T Q over half the D columns each (gc0..), both operands from shared memory.
template <class T>
struct ComputeStep<T, 2> {
  static constexpr int D = T::kHeadDim, BM = T::kBlockM, DT = T::kDtype;
  static constexpr int GA = D / 4, GB = D / 4;
  static constexpr int HM = BM / 2;  // this warpgroup's query columns: qc .. qc+HM-1
  struct Scores {
    float st[HM / 2], dpt[HM / 2];  // S^T -> P^T, dP^T -> dS^T over the warpgroup's query columns
  };
  template <class ScoresDone>
  __device__ __forceinline__ static void run(const BlockTiles& b, const StepArgs& a, Scores& sc, float (&ga)[GA],
                                             float (&gb)[GB], ScoresDone scores_done, int gc0) {
    const int qc = a.wg * HM;
    float(&st)[HM / 2] = sc.st;
    float(&dpt)[HM / 2] = sc.dpt;
    wgmma_fence_regs(st);
    wgmma_fence_regs(dpt);
    wgmma_fence();
    gemm_abt<HM, D, DT>(st, b.k, b.q + 2 * qc * D);
    gemm_abt<HM, D, DT>(dpt, b.v, b.dout + 2 * qc * D);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(st);
    wgmma_fence_regs(dpt);
    probs<HM>(st, b.lse + qc, a.scale_log2, b.needs_mask, b.key0, a.m0 + qc, a.seq_k, a.causal_offset, T::kCausal, a.g,
              a.tig);
    dscores<HM>(dpt, [&](int j, int e) { return st[4 * j + e]; }, b.delta + qc, a.tig);
    store_frags<DT, HM, BM>(b.pt, st, a.wrow + a.g, qc, a.tig);
    store_frags<DT, HM, BM>(b.ds, dpt, a.wrow + a.g, qc, a.tig);
    fence_proxy_async();
    scores_done();  // its barrier: P^T, dS^T complete (both halves)
    wgmma_fence_regs(ga);
    wgmma_fence_regs(gb);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {  // dV[:, gc0..] += P^T dO[:, gc0..]; dK likewise with dS^T, Q
      wgmma_ss<D / 2, DT, 0, 1>(ga, desc_k_major<BM>(b.pt + 256 * kk), desc_mn_major<D>(b.dout + 32 * D * kk + 16 * gc0), 1);
      wgmma_ss<D / 2, DT, 0, 1>(gb, desc_k_major<BM>(b.ds + 256 * kk), desc_mn_major<D>(b.q + 32 * D * kk + 16 * gc0), 1);
    }
    wgmma_commit();
  }
};

// ---- DQ_RED: how a block's dQ piece reaches dq_accum (fp32, rows below seq_q) ---------------------------
// add(): one wgmma chunk (64 rows at m0 + dq_m + wrow + g (+8), columns dq_c + c0 ..) times scale, after
// the block's barrier; end_block(): after every chunk; start_block() at step t's start, after its
// barrier; before_products() after the dV, dK products are waited for; finish() before the kernel
// ends. dq_holds_other_slot: the block's tile is staged in its own (then dead) Q/dO slot, so the next
// block's prefetch waits until the copy engine has read it. needs_staging_barrier: the barrier before
// the dQ product is needed whatever SPLIT and STAGES are.
struct DqRows {
  float* accum;  // dq_accum of the group's first query head (multi-head: of the CTA's head)
  int seq_q, dq_m, dq_c, wrow, g, tig, lane, warp, tid;
  int stride;  // between a head's rows: D, packed H*D
};
// One step's rows: its query head's dq_accum and the block's first row.
struct DqBlock {
  float* accum;
  int m0;
};
// Packed: the group's heads are D elements apart in a token's row.
template <class T, bool VARLEN = false>
__device__ __forceinline__ DqBlock dq_block(const DqRows& r, const QueryStep& st) {
  if constexpr (VARLEN)
    return {r.accum + st.hq * T::kHeadDim, st.mb * T::kBlockM};
  else
    return {r.accum + static_cast<long long>(st.hq) * r.seq_q * T::kHeadDim, st.mb * T::kBlockM};
}

// DETERMINISTIC: the turns of the CTA's key block at its steps' query blocks (bwd_dq_turn), taken by
// DQ_RED 3's issuers around each tile's reduction: wait() before it is issued, pass() once it is complete.
// Packed, lane 0 of warp 0 waits and passes for the warp (each lane reduces rows of the tile: every lane's
// reductions complete, then the warp's barrier, then the release). Empty when not DETERMINISTIC.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
template <class T, bool PACKED, bool DET = T::kDeterministic>
struct DqTurns {
  template <class P>
  __device__ __forceinline__ static DqTurns make(const P&, const VarlenSeq&, long long, int, int, int, int) {
    return {};
  }
};
template <class T, bool PACKED>
struct DqTurns<T, PACKED, true> {
  int* counters;   // the group's first query head's (turn_counters: the counter of row r at r)
  long long head;  // counters between the group's heads: seq_q, packed total_q
  int key_block, seq_q, seq_k;
  // bh_q0: the group's first query head (dense), h0: its index (packed); seq_q, seq_k: the sequence's.
  template <class P>
  __device__ __forceinline__ static DqTurns make(const P& p, const VarlenSeq& vs, long long bh_q0, int h0,
                                                 int key_block, int seq_q, int seq_k) {
    int* c = turn_counters<T, PACKED>(p, vs);
    return PACKED ? DqTurns{c + vs.lse_offset(h0), vs.total_q, key_block, seq_q, seq_k}
                  : DqTurns{c + bh_q0 * seq_q, seq_q, key_block, seq_q, seq_k};
  }
  __device__ __forceinline__ int* at(const QueryStep& st) const { return counters + st.hq * head + st.mb * T::kBlockM; }
  __device__ __forceinline__ void wait(int lane, const QueryStep& st) const {
    if (!PACKED || lane == 0)
      turn_wait(at(st), bwd_dq_turn(T::kDeterministicOrder, key_block, st.mb, T::kBlockM, T::kBlockN, seq_q, seq_k));
    if constexpr (PACKED) {
      __syncwarp();
      fence_proxy_async_global();  // each lane's reductions after what lane 0's acquire saw
    }
  }
  __device__ __forceinline__ void pass(int lane, const QueryStep& st) const {
    bulk_wait<0>();  // this thread's reductions complete (written, not only read)
    if constexpr (PACKED) {
      fence_proxy_async_global();
      __syncwarp();
    }
    if (!PACKED || lane == 0) turn_pass(at(st));
  }
};

// PACKED: the packed form's (only DQ_RED 3 differs: rows H*D apart in dq_accum).
template <class T, int RED = T::kDqRed, bool PACKED = false>
struct DqReducer;

// DQ_RED 0: red.global.add.v2.f32 from the accumulators' layout.
template <class T, bool PACKED>
struct DqReducer<T, 0, PACKED> {
  static constexpr bool dq_holds_other_slot = false, needs_staging_barrier = false;
  __device__ __forceinline__ static DqReducer make(const DkdvSmem<T>&) { return {}; }
  template <int N>
  __device__ __forceinline__ void add(const DqRows& r, const DqBlock& b, int, const float (&dq)[N], float scale,
                                      int c0) const {
    constexpr int D = T::kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rb = r.dq_m + r.wrow + r.g + 8 * h;  // row in the block
      if (b.m0 + rb < r.seq_q) {
#pragma unroll
        for (int j = 0; j < N / 4; ++j)
          red_add_f32x2(b.accum + static_cast<long long>(b.m0 + rb) * r.stride + r.dq_c + c0 + 8 * j + 2 * r.tig,
                        scale * dq[4 * j + 2 * h], scale * dq[4 * j + 2 * h + 1]);
      }
    }
  }
  __device__ __forceinline__ void start_block(const DqRows&, int, int, const QueryStep&) const {}
  __device__ __forceinline__ void before_products(const DqRows&) const {}
  __device__ __forceinline__ void end_block(const DqRows&, const DqBlock&) const {}
  __device__ __forceinline__ void finish(const DqRows&, int, int, const QueryStep&) const {}
};

// DQ_RED 1: the block's dQ tile staged in shared memory ([BM][D + 8] fp32: rows padded by 32 bytes, so
// that the C-layout stores do not conflict), then one bulk reduction per row by warp 0, left running
// while the next block is computed and waited for before its staging.
template <class T, bool PACKED>
struct DqReducer<T, 1, PACKED> {
  static constexpr bool dq_holds_other_slot = false, needs_staging_barrier = true;
  static constexpr int kRow = T::kHeadDim + 8;
  float* stage;
  __device__ __forceinline__ static DqReducer make(const DkdvSmem<T>& sm) { return {sm.dq_stage()}; }
  template <int N>
  __device__ __forceinline__ void add(const DqRows& r, const DqBlock&, int, const float (&dq)[N], float scale,
                                      int c0) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rb = r.dq_m + r.wrow + r.g + 8 * h;
#pragma unroll
      for (int j = 0; j < N / 4; ++j)
        *reinterpret_cast<float2*>(stage + rb * kRow + r.dq_c + c0 + 8 * j + 2 * r.tig) =
            make_float2(scale * dq[4 * j + 2 * h], scale * dq[4 * j + 2 * h + 1]);
    }
  }
  __device__ __forceinline__ void start_block(const DqRows&, int, int, const QueryStep&) const {}
  __device__ __forceinline__ void before_products(const DqRows& r) const {
    if (r.warp == 0) bulk_wait_read<0>();  // the previous block's dQ rows have left the staging tile
  }
  __device__ __forceinline__ void end_block(const DqRows& r, const DqBlock& b) const {
    constexpr int D = T::kHeadDim, BM = T::kBlockM;
    fence_proxy_async();
    __syncthreads();
    if (r.warp == 0) {
      for (int row = r.lane; row < imin(BM, r.seq_q - b.m0); row += 32)
        bulk_reduce_add_f32(b.accum + static_cast<long long>(b.m0 + row) * r.stride, smem_u32(stage + row * kRow), D * 4);
      bulk_commit();
    }
  }
  __device__ __forceinline__ void finish(const DqRows& r, int, int, const QueryStep&) const {
    if (r.warp == 0) bulk_wait<0>();  // the last dQ rows reduced before shared memory goes
  }
};

// DQ_RED 2: whole-line red.v4 reductions through this warp's [16][32] staging tile (reduce_staged).
template <class T, bool PACKED>
struct DqReducer<T, 2, PACKED> {
  static constexpr bool dq_holds_other_slot = false, needs_staging_barrier = false;
  float* stage_warp;
  __device__ __forceinline__ static DqReducer make(const DkdvSmem<T>& sm) {
    return {sm.dq_stage() + (threadIdx.x >> 5) * 16 * 32};
  }
  template <int N>
  __device__ __forceinline__ void add(const DqRows& r, const DqBlock& b, int, const float (&dq)[N], float scale,
                                      int c0) const {
    constexpr int D = T::kHeadDim;
    reduce_staged<2 * N, D>(stage_warp, dq, scale,
                            b.accum + static_cast<long long>(b.m0 + r.dq_m + r.wrow) * r.stride + r.dq_c + c0,
                            r.seq_q - (b.m0 + r.dq_m + r.wrow), r.lane, r.stride);
  }
  __device__ __forceinline__ void start_block(const DqRows&, int, int, const QueryStep&) const {}
  __device__ __forceinline__ void before_products(const DqRows&) const {}
  __device__ __forceinline__ void end_block(const DqRows&, const DqBlock&) const {}
  __device__ __forceinline__ void finish(const DqRows&, int, int, const QueryStep&) const {}
};

// DQ_RED 3: the block's dQ tile ([BM][D] fp32, piece c4 of row r at c4 ^ (r % 8), as in dq_accum)
// written into its own Q/dO slot, then added to dq_accum by one bulk reduction issued after the next
// block's first barrier (start_block); that slot is refilled once the copy engine has read it.
// Packed, the block's rows are H*D apart in dq_accum: warp 0 reduces it one row per lane (each lane's own bulk
// group, so warp 0 waits where thread 0 does dense).
// DETERMINISTIC: the issuers wait for the tile's turn before its reduction, and where the slot is refilled
// (pass_turn) wait for the reduction to complete, not only to be read, and pass the turn on (DqTurns).
template <class T, bool PACKED>
struct DqReducer<T, 3, PACKED> {
  static constexpr bool dq_holds_other_slot = true, needs_staging_barrier = true;
  DkdvSmem<T> sm;
  DqTurns<T, PACKED> turns;  // DETERMINISTIC: set by the kernel once it knows its key block and heads
  __device__ __forceinline__ static DqReducer make(const DkdvSmem<T>& sm) { return {sm, {}}; }
  template <int N>
  __device__ __forceinline__ void add(const DqRows& r, const DqBlock&, int s, const float (&dq)[N], float scale,
                                      int c0) const {
    constexpr int D = T::kHeadDim;
    float* tile = sm.template at<float>(sm.q(s));  // this block's slot, as fp32
    // This thread's rows are g (mod 8): the pair at column 8j + 2 tig of the chunk (piece 2j + tig/2)
    // goes to piece 2 (j ^ g/2) + (tig/2 ^ g%2).
    float* row_g = tile + (r.dq_m + r.wrow + r.g) * D + r.dq_c + c0 + 4 * ((r.tig >> 1) ^ (r.g & 1)) + 2 * (r.tig & 1);
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      float* at = row_g + 8 * (j ^ (r.g >> 1));
      *reinterpret_cast<float2*>(at) = make_float2(scale * dq[4 * j], scale * dq[4 * j + 1]);
      *reinterpret_cast<float2*>(at + 8 * D) = make_float2(scale * dq[4 * j + 2], scale * dq[4 * j + 3]);
    }
  }
  // Who issues the bulk reductions: thread 0 (one copy of the tile), packed warp 0 (a copy per row).
  __device__ __forceinline__ static bool issues(const DqRows& r) { return PACKED ? r.warp == 0 : r.tid == 0; }
  // The tile of a finished step (its query head's rows), from slot.
  __device__ __forceinline__ void reduce(const DqRows& r, const QueryStep& done, int slot) const {
    constexpr int D = T::kHeadDim, BM = T::kBlockM;
    const DqBlock b = dq_block<T, PACKED>(r, done);
    if constexpr (PACKED) {
      for (int row = r.lane; row < imin(BM, r.seq_q - b.m0); row += 32)
        bulk_reduce_add_f32(b.accum + static_cast<long long>(b.m0 + row) * r.stride,
                            sm.q(slot) + static_cast<unsigned>(row * D * 4), D * 4);
    } else {
      bulk_reduce_add_f32(b.accum + static_cast<long long>(b.m0) * D, sm.q(slot),
                          static_cast<unsigned>(imin(BM, r.seq_q - b.m0) * D * 4));
    }
    bulk_commit();
  }
  // Step t's start: step t-1's (prev) tile, in slot s^1.
  __device__ __forceinline__ void start_block(const DqRows& r, int t, int s, const QueryStep& prev) const {
    if (issues(r) && t > 0) {
      if constexpr (T::kDeterministic) turns.wait(r.lane, prev);
      reduce(r, prev, s ^ 1);
    }
  }
  // DETERMINISTIC, where the kernel would wait for step t-1's (prev) tile to be read out of the other slot (step
  // t's scores in registers, before the slot is refilled): its reduction complete, and the turn passed on.
  __device__ __forceinline__ void pass_turn(const DqRows& r, int t, const QueryStep& prev) const {
    if (issues(r) && t > 0) turns.pass(r.lane, prev);
  }
  __device__ __forceinline__ void before_products(const DqRows&) const {}
  __device__ __forceinline__ void end_block(const DqRows&, const DqBlock&) const {}
  // The last step's (last) tile, if any (DETERMINISTIC: in its turn, passed on once complete), then every
  // reduction complete.
  __device__ __forceinline__ void finish(const DqRows& r, int steps, int s, const QueryStep& last) const {
    if (steps > 0) {
      fence_proxy_async();
      __syncthreads();
      if (issues(r)) {
        if constexpr (T::kDeterministic) turns.wait(r.lane, last);
        reduce(r, last, s ^ 1);
        if constexpr (T::kDeterministic) turns.pass(r.lane, last);
      }
    }
    if (issues(r)) bulk_wait<0>();
  }
};

}  // namespace fa2_wgmma_bwd_detail

// One CTA per K/V block j, kv head and batch (det::Work: SCHED 0 x, y, z; SCHED 1 and 3 pairs in groups, j on
// y; fa2_wgmma_bwd_traits.h): dK_j, dV_j over every query block i that can see
// the block, of every query head of the kv head's group (grouped-query attention; one head when
// multi-head), as one sequence of steps in a rotated order (below); dq_accum[head][i] += scale * dS_ij K_j.
// Per step: its Q, dO, lse and delta arrive (BlockLoader, LOAD), the scores and the dV, dK products
// (ComputeStep, SPLIT), then the dQ piece as wgmma chunks handed to the reducer (DqReducer, DQ_RED).
// dK, dV stay in registers over all the steps and are stored once: summed over the group without
// atomics, in a fixed order (deterministic).
// Generated code: as the single-function kernel these pieces replaced (issue 14): the score registers
// are declared in the loop body (ComputeStep::Scores), the loader is made where that kernel took its
// input pointers, and each address is computed where and as that kernel computed it.
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kDkdvThreads, 1)
    fa2_wgmma_bwd_dkdv(const typename ParamsOf<VARLEN, AttnBwdParams>::type p) {
  using T = Traits;
  namespace det = fa2_wgmma_bwd_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int NT = T::kDkdvThreads;
  constexpr int SPLIT = T::kSplit;
  constexpr int STAGES = T::kStages;
  constexpr int DT = T::kDtype;
  constexpr bool CAUSAL = T::kCausal;
  constexpr int DQC = T::kDqCols;
  constexpr int DQ_CHUNK = T::kDqChunk;  // dQ columns per wgmma chain
  check_dynamic_smem(T::kDkdvSmemBytes);

  extern __shared__ __align__(128) unsigned char fa2_wgmma_bwd_smem[];
  const det::DkdvSmem<T> sm{fa2_wgmma_bwd_smem, smem_u32(fa2_wgmma_bwd_smem)};
  using Dq = det::DqReducer<T, T::kDqRed, VARLEN>;
  Dq dqr = Dq::make(sm);  // DETERMINISTIC: its turns set below

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wg = warp >> 2;   // warpgroup
  const int wtid = tid & 127;  // thread within the warpgroup
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int wrow = 16 * (warp & 3);             // this warp's rows within its warpgroup's 64-row tiles
  const int kr0 = SPLIT == 0 ? 64 * wg : 0;     // first key of this warpgroup's tile in the block
  const int dq_m = (wg / T::kDqColPieces) * 64;  // this warpgroup's dQ piece: query rows, columns
  const int dq_c = (wg % T::kDqColPieces) * DQC;

  const det::Work<T> w(p);  // DETERMINISTIC 2: key blocks from the last down
  if constexpr (T::kPairGroups)  // the last group's CTAs past the pairs: before any barrier
    if (w.batch() >= static_cast<unsigned>(p.batch)) return;
  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, w.batch());
  const int seq_q = VARLEN ? vs.seq_q : p.seq_q;
  const int seq_k = VARLEN ? vs.seq_k : p.seq_k;
  const int n0 = w.key_block() * BN;
  if (n0 >= seq_k) return;  // whole block (packed: past its sequence's keys): safe before any barrier
  // K, V, dK, dV of kv head w.kv_head(); Q, dO, lse, delta, dq_accum (and LOAD 1's images) of the group's query
  // heads kv_head*group .. kv_head*group+group-1, consecutive from bh_q0.
  const int group = query_group(p);
  const long long bh_kv = static_cast<long long>(w.batch()) * (p.heads_k > 0 ? p.heads_k : p.heads) + w.kv_head();
  const long long bh_q0 = static_cast<long long>(w.batch()) * p.heads + static_cast<long long>(w.kv_head()) * group;
  // Packed: token-major rows of every head, H*D (Q side) and Hk*D (K side) elements apart.
  const int h0 = w.kv_head() * group;
  const int kv_heads = p.heads_k > 0 ? p.heads_k : p.heads;
  const int q_stride = VARLEN ? p.heads * D : D;
  const int k_stride = VARLEN ? kv_heads * D : D;
  det::BlockLoader<T, VARLEN> loader(sm, p, bh_q0, tid);
  const unsigned short* k =
      static_cast<const unsigned short*>(p.k) + (VARLEN ? vs.k_offset(kv_heads, w.kv_head(), D) : bh_kv * seq_k * D);
  const unsigned short* v =
      static_cast<const unsigned short*>(p.v) + (VARLEN ? vs.k_offset(kv_heads, w.kv_head(), D) : bh_kv * seq_k * D);
  const det::DqRows rows{p.dq_accum + (VARLEN ? vs.q_offset(p.heads, h0, D) : bh_q0 * seq_q * D),
                         seq_q, dq_m, dq_c, wrow, g, tig, lane, warp, tid, q_stride};
  const float scale_log2 = p.scale_log2;
  if constexpr (T::kDeterministic)
    dqr.turns = det::DqTurns<T, VARLEN>::make(p, vs, bh_q0, h0, w.key_block(), seq_q, seq_k);

  // Query i sees key n iff n <= i + causal_offset: only query blocks reaching row n0 - causal_offset.
  const int causal_offset = seq_k - seq_q;
  const int num_m_blocks = ceil_div(seq_q, BM);
  const int first_m_block = CAUSAL ? imax(0, n0 - causal_offset) / BM : 0;
  // Steps: the visible query blocks of each query head of the group, visited from a per-CTA rotation
  // (step m_rot of the sequence first): CTAs of one kv head that run together then add into different
  // rows of dq_accum instead of contending for the same L2 lines. DETERMINISTIC: in order from step 0 (a
  // key block waits for its turn at each query block: rotated, for its neighbour's whole lap).
  const det::QuerySteps sched{first_m_block, num_m_blocks, group};
  const int steps = sched.count();
  const int m_rot = !T::kDeterministic && steps > 0 ? static_cast<int>(w.key_block()) % steps : 0;
  det::QueryStep cur = sched.at(m_rot);
  det::QueryStep prev = cur;  // the step before cur (DQ_RED 3 reduces its dQ tile at cur's start)

  loader.init(p, bh_q0);
  det::load_rows_il<BN, D, NT>(sm.k, k, n0, seq_k, tid, k_stride);
  det::load_rows_il<BN, D, NT>(sm.v(), v, n0, seq_k, tid, k_stride);
  if (steps > 0) loader.load(cur, 0);
  cp_async_commit();

  // Kept gradients: SPLIT 0 both (ga = dV, gb = dK); SPLIT 1 one per warpgroup (ga = dV on
  // warpgroup 0, dK on warpgroup 1); SPLIT 2 columns gc0.. of both (ga = dV, gb = dK).
  using Step = det::ComputeStep<T>;
  const int gc0 = SPLIT == 2 ? wg * (D / 2) : 0;
  float ga[Step::GA], gb[Step::GB];
  det::zero(ga);
  det::zero(gb);

  int s = 0;
  // Counted down (left: the steps from this one on): counted up, ptxas kept one more register and the
  // 255-register d = 128, BM 128, SPLIT 1, LOAD 0 variant spilled 4 bytes (NVRTC 13.0).
  for (int left = steps; left > 0; --left) {
    const int t = steps - left;  // DQ_RED 3's start_block only
    const det::QueryStep nxt = sched.next(cur);
    const det::DqBlock qb = det::dq_block<T, VARLEN>(rows, cur);
    const int m0 = qb.m0;
    cp_async_wait<0>();   // step t's block (K, V too on the first pass)
    loader.wait(s);
    fence_proxy_async();  // ... visible to the tensor cores' reads (DQ_RED 3: step t-1's dQ tile to the copy engine)
    __syncthreads();      // and to every thread; everyone is done with step t-1 (its slot, dS^T, P^T)
    auto prefetch_next = [&]() {
      if (left > 1) loader.load(nxt, s ^ 1);
      cp_async_commit();
    };
    dqr.start_block(rows, t, s, prev);
    if constexpr (!Dq::dq_holds_other_slot && STAGES == 2) prefetch_next();
    // Where the scores are in registers: DQ_RED 3 refills the other slot once block t-1's dQ tile is read
    // out of it (its barrier is SPLIT 2's after P^T and dS^T); SPLIT 2 otherwise needs that barrier alone.
    auto scores_done = [&]() {
      if constexpr (Dq::dq_holds_other_slot) {
        if constexpr (T::kDeterministic)
          dqr.pass_turn(rows, t, prev);  // step t-1's tile reduced (so read too), its turn passed on
        else if (VARLEN ? warp == 0 : tid == 0)
          bulk_wait_read<0>();  // the issuers of the tile's reductions
        __syncthreads();
        prefetch_next();
      } else if constexpr (SPLIT == 2) {
        __syncthreads();
      }
    };
    const float* lse_s = sm.lse(s);
    const det::BlockTiles tiles{lse_s,
                                lse_s + BM,
                                opaque(sm.k),
                                opaque(sm.v()),
                                opaque(sm.q(s)),
                                opaque(sm.dout(s)),
                                opaque(sm.ds()),
                                opaque(sm.pt()),
                                n0 + kr0 + wrow,
                                (n0 + kr0 + 64 > seq_k) || (CAUSAL && n0 + kr0 + 63 > m0 + causal_offset)};
    const det::StepArgs args{scale_log2, m0, seq_k, causal_offset, kr0, wrow, wg, wtid, g, tig, 2 * kr0 * D};
    typename Step::Scores sc;  // in the loop body, not inside run(): see ComputeStep
    if constexpr (SPLIT == 0)
      Step::run(tiles, args, sc, ga, gb, scores_done);
    else if constexpr (SPLIT == 1)
      Step::run(tiles, args, sc, ga, gb, scores_done, sm.template at<float4>(sm.pt()));
    else
      Step::run(tiles, args, sc, ga, gb, scores_done, gc0);

    wgmma_wait<0>();  // dV, dK products done: Q_i, dO_i and the A fragments are free
    wgmma_fence_regs(ga);
    wgmma_fence_regs(gb);
    dqr.before_products(rows);
    if constexpr (SPLIT != 2 || STAGES == 1 || Dq::needs_staging_barrier) {
      fence_proxy_async();
      __syncthreads();  // dS^T complete for every warpgroup; STAGES 1, DQ_RED 3: Q_i, dO_i free; DQ_RED 1: staging free
    }
    if constexpr (STAGES == 1) {
      if (left > 1) loader.load(nxt, 0);
      cp_async_commit();
    }

    // dQ piece: rows dq_m .. dq_m+63 of the block, columns dq_c .. dq_c+DQC-1 in chunks of DQ_CHUNK
    // (registers); A = dS (M-major view of dS^T), B = K (MN-major), k over the BN keys.
    const float scale = p.scale;
#pragma unroll
    for (int c0 = 0; c0 < DQC; c0 += DQ_CHUNK) {
      float dq[DQ_CHUNK / 2];
      wgmma_fence_regs(dq);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
        wgmma_ss<DQ_CHUNK, DT, 1, 1>(dq, desc_mn_major<BM>(tiles.ds + 32 * BM * ks + 16 * dq_m),
                                     desc_mn_major<D>(tiles.k + 32 * D * ks + 16 * (dq_c + c0)), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(dq);
      dqr.add(rows, qb, s, dq, scale, c0);
    }
    dqr.end_block(rows, qb);
    if constexpr (STAGES == 2) s ^= 1;
    prev = cur;
    cur = nxt;
  }
  cp_async_wait<0>();  // nothing in flight at exit (no query block: K, V unused)
  dqr.finish(rows, steps, s, prev);

  // dK (times scale), dV rows of the kv head, summed over its group; zeros for a block no query sees.
  unsigned short* dk_out =
      static_cast<unsigned short*>(p.dk) + (VARLEN ? vs.k_offset(kv_heads, w.kv_head(), D) : bh_kv * seq_k * D);
  unsigned short* dv_out =
      static_cast<unsigned short*>(p.dv) + (VARLEN ? vs.k_offset(kv_heads, w.kv_head(), D) : bh_kv * seq_k * D);
  // Through shared memory (store_rows_staged: whole rows, 16 bytes a lane), each warp's rows in the K or V tile,
  // free once every warpgroup is past its last products (all of them read all of K and V). SPLIT 1: warpgroup 0's
  // dV in V, 1's dK in K; SPLIT 0: the warpgroup's keys, SPLIT 2: its half of the columns, of both.
  __syncthreads();
  const int row0 = n0 + kr0 + wrow;  // the warp's first key
  const unsigned at = static_cast<unsigned>((SPLIT == 1 ? wrow : 64 * wg + wrow) * Step::GA * 4);
  if constexpr (SPLIT == 1) {
    store_rows_staged<DT, Step::GA * 2>(wg == 0 ? dv_out : dk_out, ga, wg == 0 ? 1.f : p.scale,
                                        (wg == 0 ? sm.v() : sm.k) + at, row0, seq_k, lane, k_stride, 0);
  } else {
    static_assert(Step::GA == Step::GB, "dK and dV tiles of one shape");
    store_rows_staged<DT, Step::GA * 2>(dv_out, ga, 1.f, sm.v() + at, row0, seq_k, lane, k_stride, gc0);
    store_rows_staged<DT, Step::GB * 2>(dk_out, gb, p.scale, sm.k + at, row0, seq_k, lane, k_stride, gc0);
  }
}

}  // namespace flashtune
