// FlashAttention-2 backward on Hopper's warpgroup MMA (wgmma, sm_90a), fp16 or bf16 in and out,
// fp32 accumulation. Kernels, launched in order (T = Fa2WgmmaBwdTraits<D, BLOCK_M, BLOCK_N, SPLIT,
// STAGES, DQ_RED, LOAD, DTYPE, CAUSAL>):
//   fa2_wgmma_bwd_preprocess<T>  delta = rowsum(dO * O), dq_accum = 0; LOAD 1: the tile images of Q, dO,
//                                lse, delta that the dK/dV kernel bulk-copies
//   fa2_wgmma_bwd_dkdv<T>        one CTA per K/V block j: dK_j, dV_j; dq_accum += scale dS K_j
//   fa2_mma_bwd_dq<T>            dQ = 16-bit(dq_accum)                        (shared with fa2_mma_bwd)
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
// Masking as fa2_mma_bwd: padded rows are zero-filled (lse, delta too), so a padded query
// contributes exactly zero; keys past seq_k and causal keys k > q + seq_k - seq_q get P = 0 on
// tiles that straddle them; a fully masked row has lse = +inf: P = 0.
#pragma once
#include "fa2_mma_bwd.cuh"
#include "fa2_wgmma_bwd_traits.h"
#include "wgmma_common.cuh"

namespace flashtune {

namespace fa2_wgmma_bwd_detail {

// Rows [row0, row0+ROWS) of a (seq, D) 16-bit matrix into an interleaved tile by 16-byte cp.async.
// Thread order: row within the 8-row group fastest, then chunk, then row group, so 8 consecutive
// threads fill one 128-byte core matrix. Rows >= seq are zero-filled.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows_il(unsigned dst, const unsigned short* src, int row0, int seq, int tid) {
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
      cp_async_16_s(dst + il_chunk<D>(r, c), ok ? src + static_cast<long long>(grow) * D + 8 * c : src, ok ? 16 : 0);
    }
  }
}

// The A fragment (mma.sync m16n8k16 layout) of k16 slice kk from accumulators in the wgmma C
// layout (n8 tile j at x[4j .. 4j+3]): tiles 2kk and 2kk+1.
template <int DTYPE, int N>
__device__ __forceinline__ void pack_a(unsigned (&a)[4], const float (&x)[N], int kk) {
  a[0] = pack_half2<DTYPE>(x[8 * kk + 0], x[8 * kk + 1]);
  a[1] = pack_half2<DTYPE>(x[8 * kk + 2], x[8 * kk + 3]);
  a[2] = pack_half2<DTYPE>(x[8 * kk + 4], x[8 * kk + 5]);
  a[3] = pack_half2<DTYPE>(x[8 * kk + 6], x[8 * kk + 7]);
}

// x, hidden from the optimiser: tile addresses made opaque once per query block, so that ptxas
// rebuilds each descriptor (one add) instead of hoisting dozens of them out of the loop in registers.
__device__ __forceinline__ unsigned opaque(unsigned x) {
  asm volatile("" : "+r"(x));
  return x;
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

// All k16 slices of a 64 x K accumulator tile as 16-bit A fragments.
template <int DTYPE, int K>
__device__ __forceinline__ void pack_all(unsigned (&a)[K / 16][4], const float (&x)[K / 2]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) pack_a<DTYPE, K / 2>(a[kk], x, kk);
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

// Rows of a 64 x NCOL accumulator tile (this thread's elements) to columns col0.. of a (seq, D)
// 16-bit matrix, times mul.
template <int DTYPE, int NCOL, int D>
__device__ __forceinline__ void store_tile(unsigned short* out, const float (&acc)[NCOL / 2], float mul, int row0,
                                           int col0, int seq, int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r < seq) {
#pragma unroll
      for (int j = 0; j < NCOL / 8; ++j)
        *reinterpret_cast<unsigned*>(out + static_cast<long long>(r) * D + col0 + 8 * j + 2 * tig) =
            pack_half2<DTYPE>(acc[4 * j + 2 * h] * mul, acc[4 * j + 2 * h + 1] * mul);
    }
  }
}

// This thread's elements of a 64 x N accumulator tile (rows row, row + 8), packed to 16 bits, into
// columns col0.. of an interleaved tile of C columns.
template <int DTYPE, int N, int C>
__device__ __forceinline__ void store_frags(unsigned tile, const float (&x)[N / 2], int row, int col0, int tig) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    st_shared_u32(tile + il_chunk<C>(row, col0 / 8 + j) + 4 * tig, pack_half2<DTYPE>(x[4 * j], x[4 * j + 1]));
    st_shared_u32(tile + il_chunk<C>(row + 8, col0 / 8 + j) + 4 * tig, pack_half2<DTYPE>(x[4 * j + 2], x[4 * j + 3]));
  }
}

// DQ_RED 2: a warp's 16 x C piece of dQ (accumulators in the C layout, times mul) added into rows
// 0..15 of out (row stride D; rows >= rows_left skipped), 32 columns at a time through the warp's
// 16 x 32 fp32 staging tile: stored in 16-byte pieces swizzled by row (piece c4 of row r at
// c4 ^ (r % 8): conflict free), read back 8 lanes per row, so that every red.v4 instruction of the
// warp covers four whole 128-byte rows (instead of 8 rows x 32 bytes from the C layout).
template <int C, int D, int N>
__device__ __forceinline__ void reduce_staged(float* stage, const float (&acc)[N], float mul, float* out, int rows_left,
                                              int lane) {
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
      if (r < rows_left) red_add_f32x4(out + static_cast<long long>(r) * D + 32 * c32 + 4 * c4, v);
    }
    __syncwarp();  // read before the next piece overwrites it
  }
}

// LOAD 1's images in p.workspace (traits: fa2_wgmma_bwd_workspace_bytes), for (batch, head) bh with
// R = seq_q rounded up to BM rows: Q and dO as [R/BM] interleaved [BM][D] tiles, lse and delta [R].
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

}  // namespace fa2_wgmma_bwd_detail

// delta = rowsum(dO * O) and dq_accum = 0 for rows < seq_q, as fa2_mma_bwd_preprocess; LOAD 1 also
// writes the images, zeros for the rows from seq_q up to the next multiple of BM.
template <class Traits>
__global__ void __launch_bounds__(Traits::kPreThreads) fa2_wgmma_bwd_preprocess(const AttnBwdParams p) {
  using T = Traits;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int L = T::kRowLanes;
  check_dynamic_smem(T::kPreSmemBytes);
  const int tid = threadIdx.x;
  const int g = tid % L;
  const int row = blockIdx.x * T::kRowsPerCta + tid / L;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const bool ok = row < p.seq_q;
  const long long off = (bh * p.seq_q + row) * D;
  const auto img = fa2_wgmma_bwd_detail::images<T>(p, bh);
  const int blk = row / BM, rb = row % BM;  // LOAD 1: this row's tile and row within it
  float acc = 0.f;
#pragma unroll
  for (int c = g; c < D / 8; c += L) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint4 ov = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.o) + off + 8 * c) : zero;
    const uint4 dv = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.dout) + off + 8 * c) : zero;
    acc = dot_chunk<T::kDtype>(dv, ov, acc);
    if constexpr (T::kLoad == 1) {
      const uint4 qv = ok ? *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.q) + off + 8 * c) : zero;
      const long long at = static_cast<long long>(blk) * BM * D + il_chunk<D>(rb, c) / 2;  // in 16-bit elements
      *reinterpret_cast<uint4*>(img.q + at) = qv;
      *reinterpret_cast<uint4*>(img.dout + at) = dv;
    }
  }
  if (ok) {
#pragma unroll
    for (int c = g; c < D / 4; c += L)
      *reinterpret_cast<float4*>(p.dq_accum + off + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  acc = group_sum<L>(acc);  // every lane takes part (no early exit before the shuffles)
  if (g == 0) {
    if (ok) p.delta[bh * p.seq_q + row] = acc;
    if (T::kLoad == 1 && row < fa2_wgmma_bwd_padded_rows(p.seq_q, BM)) {
      img.delta[row] = ok ? acc : 0.f;
      img.lse[row] = ok ? p.lse[bh * p.seq_q + row] : 0.f;
    }
  }
}

// One CTA per K/V block j (x), head (y), batch (z): dK_j, dV_j over every query block i that can see
// the block (in a rotated order, below); dq_accum[i] += scale * dS_ij K_j.
template <class Traits>
__global__ void __launch_bounds__(Traits::kDkdvThreads, 1) fa2_wgmma_bwd_dkdv(const AttnBwdParams p) {
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
  const unsigned k_tile = smem_u32(fa2_wgmma_bwd_smem);  // K [BN][D]
  const unsigned v_tile = k_tile + 2 * BN * D;           // V [BN][D]
  const unsigned qdo_base = v_tile + 2 * BN * D;         // STAGES x {Q, dO} [BM][D]
  const unsigned ds_tile = qdo_base + STAGES * 4 * BM * D;  // dS^T [BN][BM]
  const unsigned p_tile = ds_tile + 2 * BN * BM;            // P^T: SPLIT 1 fp32 (float4 slot q of thread t at (q*128+t)*16), SPLIT 2 16-bit [64][BM]
  constexpr int kStatsOff = 2 * (2 * BN * D + STAGES * 2 * BM * D + BN * BM) + fa2_wgmma_bwd_p_bytes(BM, SPLIT);
  constexpr int kDqStageOff = kStatsOff + 8 * STAGES * BM;  // DQ_RED 1: dQ tile [BM][D + 8] fp32; 2: per warp
  constexpr int kDqStageRow = D + 8;  // DQ_RED 1: rows padded by 32 bytes, so that the C-layout stores do not conflict
  float* dq_stage = reinterpret_cast<float*>(fa2_wgmma_bwd_smem + kDqStageOff);
  float* dq_stage_warp = dq_stage + (threadIdx.x >> 5) * 16 * 32;  // DQ_RED 2: this warp's [16][32]
  const float* stats = reinterpret_cast<const float*>(fa2_wgmma_bwd_smem + kStatsOff);  // STAGES x {lse, delta} [BM]
  const unsigned stats_s = k_tile + kStatsOff;
  // LOAD 1: one mbarrier per stage, after everything else; bulk copies of block t complete phase t / STAGES.
  constexpr int kBarOff = kDqStageOff + fa2_wgmma_bwd_dq_stage_bytes(D, BM, BN, SPLIT, T::kDqRed);
  auto stage_bar = [&](int st) { return k_tile + static_cast<unsigned>(kBarOff + 8 * st); };
  auto q_tile = [&](int s) { return qdo_base + static_cast<unsigned>(s * 4 * BM * D); };
  auto do_tile = [&](int s) { return qdo_base + static_cast<unsigned>(s * 4 * BM * D + 2 * BM * D); };

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

  const int seq_q = p.seq_q;
  const int seq_k = p.seq_k;
  const int n0 = blockIdx.x * BN;
  if (n0 >= seq_k) return;  // whole block: safe before any barrier
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const unsigned short* q = static_cast<const unsigned short*>(p.q) + bh * seq_q * D;
  const unsigned short* k = static_cast<const unsigned short*>(p.k) + bh * seq_k * D;
  const unsigned short* v = static_cast<const unsigned short*>(p.v) + bh * seq_k * D;
  const unsigned short* dout = static_cast<const unsigned short*>(p.dout) + bh * seq_q * D;
  const float* lse = p.lse + bh * seq_q;
  const float* delta = p.delta + bh * seq_q;
  float* dq_accum = p.dq_accum + bh * seq_q * D;
  const float scale_log2 = p.scale_log2;

  // Query i sees key n iff n <= i + causal_offset: only query blocks reaching row n0 - causal_offset.
  const int causal_offset = seq_k - seq_q;
  const int num_m_blocks = ceil_div(seq_q, BM);
  const int first_m_block = CAUSAL ? imax(0, n0 - causal_offset) / BM : 0;
  // The visible query blocks, visited from a per-CTA rotation: CTAs of one head that run together
  // then add into different rows of dq_accum instead of contending for the same L2 lines.
  const int m_count = num_m_blocks - first_m_block;
  const int m_rot = m_count > 0 ? static_cast<int>(blockIdx.x) % m_count : 0;
  auto m_block = [&](int t) { return first_m_block + (t + m_rot) % m_count; };

  const det::Images img = det::images<T>(p, bh);
  auto load_block = [&](int mb, int s) {
    if constexpr (T::kLoad == 1) {  // the block's images (padded: no bounds), by one thread
      if (tid == 0) {
        const long long row0 = static_cast<long long>(mb) * BM;
        mbar_arrive_expect_tx(stage_bar(s), 4 * BM * D + 8 * BM);
        bulk_load(q_tile(s), img.q + row0 * D, 2 * BM * D, stage_bar(s));
        bulk_load(do_tile(s), img.dout + row0 * D, 2 * BM * D, stage_bar(s));
        bulk_load(stats_s + 8 * s * BM, img.lse + row0, 4 * BM, stage_bar(s));
        bulk_load(stats_s + 8 * s * BM + 4 * BM, img.delta + row0, 4 * BM, stage_bar(s));
      }
    } else {
      det::load_rows_il<BM, D, NT>(q_tile(s), q, mb * BM, seq_q, tid);
      det::load_rows_il<BM, D, NT>(do_tile(s), dout, mb * BM, seq_q, tid);
      fa2_mma_bwd_detail::load_stats<BM, NT>(stats_s + 8 * s * BM, stats_s + 8 * s * BM + 4 * BM, lse, delta, mb * BM,
                                             seq_q, tid);
    }
  };
  unsigned bar_parity = 0;  // LOAD 1: bit st = the parity of stage st's next phase
  if constexpr (T::kLoad == 1) {
    if (tid == 0) {
      for (int st = 0; st < STAGES; ++st) mbar_init(stage_bar(st), 1);
      fence_mbar_init();
    }
    __syncthreads();
  }

  det::load_rows_il<BN, D, NT>(k_tile, k, n0, seq_k, tid);
  det::load_rows_il<BN, D, NT>(v_tile, v, n0, seq_k, tid);
  if (m_count > 0) load_block(m_block(0), 0);
  cp_async_commit();

  // Kept gradients: SPLIT 0 both (ga = dV, gb = dK); SPLIT 1 one per warpgroup (ga = dV on
  // warpgroup 0, dK on warpgroup 1); SPLIT 2 columns gc0.. of both (ga = dV, gb = dK).
  constexpr int GA = SPLIT == 2 ? D / 4 : D / 2;
  constexpr int GB = SPLIT == 0 ? D / 2 : SPLIT == 2 ? D / 4 : 2;
  const int gc0 = SPLIT == 2 ? wg * (D / 2) : 0;
  float ga[GA], gb[GB];
  det::zero(ga);
  det::zero(gb);

  // DQ_RED 3: block t's dQ tile, staged in its own (then dead) Q/dO slot, is added to dq_accum by one
  // bulk reduction issued after block t+1's first barrier; block t+2 may refill that slot once the
  // copy engine has read it, which is waited for after block t+1's scores (prefetch_next).
  auto reduce_block = [&](int mb_done, int slot) {
    const int m0_done = mb_done * BM;
    bulk_reduce_add_f32(dq_accum + static_cast<long long>(m0_done) * D, q_tile(slot),
                        static_cast<unsigned>(imin(BM, seq_q - m0_done) * D * 4));
    bulk_commit();
  };

  int s = 0;
  for (int t = 0; t < m_count; ++t) {
    const int mb = m_block(t);
    const int m0 = mb * BM;
    cp_async_wait<0>();   // block mb (K, V too on the first pass)
    if constexpr (T::kLoad == 1) {
      mbar_wait(stage_bar(s), (bar_parity >> s) & 1u);
      bar_parity ^= 1u << s;
    }
    fence_proxy_async();  // ... visible to the tensor cores' reads (DQ_RED 3: block t-1's dQ tile to the copy engine)
    __syncthreads();      // and to every thread; everyone is done with block mb-1 (its slot, dS^T, P^T)
    auto prefetch_next = [&]() {
      if (t + 1 < m_count) load_block(m_block(t + 1), s ^ 1);
      cp_async_commit();
    };
    if constexpr (T::kDqRed == 3) {
      if (tid == 0 && t > 0) reduce_block(m_block(t - 1), s ^ 1);
    } else if constexpr (STAGES == 2) {
      prefetch_next();
    }
    // DQ_RED 3, after the scores: block t-1's dQ tile read out of slot s^1, block t+1 into it.
    auto refill_other_slot = [&]() {
      if (tid == 0) bulk_wait_read<0>();
      __syncthreads();
      prefetch_next();
    };
    const float* lse_s = stats + 2 * s * BM;
    const float* dl_s = lse_s + BM;
    const unsigned kt = det::opaque(k_tile), vt = det::opaque(v_tile), qt = det::opaque(q_tile(s)),
                   dot = det::opaque(do_tile(s)), dst = det::opaque(ds_tile), ptt = det::opaque(p_tile);
    const int key0 = n0 + kr0 + wrow;  // this thread's rows: key0 + g, key0 + g + 8
    const bool needs_mask = (n0 + kr0 + 64 > seq_k) || (CAUSAL && n0 + kr0 + 63 > m0 + causal_offset);

    unsigned ds_a[BM / 16][4];  // SPLIT 0, 1: dS^T as 16-bit A fragments (all k16 slices), stored below
    if constexpr (SPLIT == 0) {
      float st[BM / 2], dpt[BM / 2];
      wgmma_fence_regs(st);
      wgmma_fence_regs(dpt);
      wgmma_fence();
      det::gemm_abt<BM, D, DT>(st, kt + 2 * kr0 * D, qt);
      det::gemm_abt<BM, D, DT>(dpt, vt + 2 * kr0 * D, dot);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(st);
      wgmma_fence_regs(dpt);
      if constexpr (T::kDqRed == 3) refill_other_slot();

      det::probs<BM>(st, lse_s, scale_log2, needs_mask, key0, m0, seq_k, causal_offset, CAUSAL, g, tig);
      det::dscores<BM>(dpt, [&](int j, int e) { return st[4 * j + e]; }, dl_s, tig);
      unsigned p_a[BM / 16][4];
      det::pack_all<DT, BM>(p_a, st);
      det::pack_all<DT, BM>(ds_a, dpt);
      wgmma_fence_regs(ga);
      wgmma_fence_regs(gb);
      wgmma_fence();
      det::gemm_frags_by_tile<D, BM, DT>(ga, p_a, dot);   // dV += P^T dO
      det::gemm_frags_by_tile<D, BM, DT>(gb, ds_a, qt);   // dK += dS^T Q
      wgmma_commit();
    } else if constexpr (SPLIT == 2) {
      constexpr int HM = BM / 2;  // this warpgroup's query columns: qc .. qc+HM-1
      const int qc = wg * HM;
      float st[HM / 2], dpt[HM / 2];
      wgmma_fence_regs(st);
      wgmma_fence_regs(dpt);
      wgmma_fence();
      det::gemm_abt<HM, D, DT>(st, kt, qt + 2 * qc * D);
      det::gemm_abt<HM, D, DT>(dpt, vt, dot + 2 * qc * D);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(st);
      wgmma_fence_regs(dpt);
      det::probs<HM>(st, lse_s + qc, scale_log2, needs_mask, key0, m0 + qc, seq_k, causal_offset, CAUSAL, g, tig);
      det::dscores<HM>(dpt, [&](int j, int e) { return st[4 * j + e]; }, dl_s + qc, tig);
      det::store_frags<DT, HM, BM>(ptt, st, wrow + g, qc, tig);
      det::store_frags<DT, HM, BM>(dst, dpt, wrow + g, qc, tig);
      fence_proxy_async();
      if constexpr (T::kDqRed == 3) {
        refill_other_slot();  // its barrier: P^T, dS^T complete (both halves)
      } else {
        __syncthreads();  // P^T, dS^T complete (both halves)
      }
      wgmma_fence_regs(ga);
      wgmma_fence_regs(gb);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {  // dV[:, gc0..] += P^T dO[:, gc0..]; dK likewise with dS^T, Q
        wgmma_ss<D / 2, DT, 0, 1>(ga, desc_k_major<BM>(ptt + 256 * kk), desc_mn_major<D>(dot + 32 * D * kk + 16 * gc0), 1);
        wgmma_ss<D / 2, DT, 0, 1>(gb, desc_k_major<BM>(dst + 256 * kk), desc_mn_major<D>(qt + 32 * D * kk + 16 * gc0), 1);
      }
      wgmma_commit();
    } else {
      float x[BM / 2];  // warpgroup 0: S^T -> P^T; warpgroup 1: dP^T -> dS^T
      wgmma_fence_regs(x);
      wgmma_fence();
      det::gemm_abt<BM, D, DT>(x, (wg == 0 ? kt : vt), (wg == 0 ? qt : dot));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(x);
      if constexpr (T::kDqRed == 3) refill_other_slot();
      if (wg == 0) {
        det::probs<BM>(x, lse_s, scale_log2, needs_mask, key0, m0, seq_k, causal_offset, CAUSAL, g, tig);
        float4* pt = reinterpret_cast<float4*>(fa2_wgmma_bwd_smem + (p_tile - k_tile));
#pragma unroll
        for (int qd = 0; qd < BM / 8; ++qd)
          pt[qd * 128 + wtid] = make_float4(x[4 * qd], x[4 * qd + 1], x[4 * qd + 2], x[4 * qd + 3]);
        named_bar_arrive(1, 256);  // P^T ready for warpgroup 1
        unsigned p_a[BM / 16][4];
        det::pack_all<DT, BM>(p_a, x);
        wgmma_fence_regs(ga);
        wgmma_fence();
        det::gemm_frags_by_tile<D, BM, DT>(ga, p_a, dot);  // dV += P^T dO
        wgmma_commit();
      } else {
        named_bar_sync(1, 256);
        const float4* pt = reinterpret_cast<const float4*>(fa2_wgmma_bwd_smem + (p_tile - k_tile));
        det::dscores<BM>(x, [&](int j, int e) { return reinterpret_cast<const float*>(pt + j * 128 + wtid)[e]; }, dl_s,
                         tig);
        det::pack_all<DT, BM>(ds_a, x);
        wgmma_fence_regs(ga);
        wgmma_fence();
        det::gemm_frags_by_tile<D, BM, DT>(ga, ds_a, qt);  // dK += dS^T Q
        wgmma_commit();
      }
    }

    // dS^T (16-bit) to shared memory for the dQ product; rows key0 - n0 + g (+8), query columns.
    if (SPLIT == 0 || (SPLIT == 1 && wg == 1)) {
      const int r = kr0 + wrow + g;
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        st_shared_u32(dst + il_chunk<BM>(r, 2 * kk) + 4 * tig, ds_a[kk][0]);
        st_shared_u32(dst + il_chunk<BM>(r + 8, 2 * kk) + 4 * tig, ds_a[kk][1]);
        st_shared_u32(dst + il_chunk<BM>(r, 2 * kk + 1) + 4 * tig, ds_a[kk][2]);
        st_shared_u32(dst + il_chunk<BM>(r + 8, 2 * kk + 1) + 4 * tig, ds_a[kk][3]);
      }
    }
    wgmma_wait<0>();  // dV, dK products done: Q_i, dO_i and the A fragments are free
    wgmma_fence_regs(ga);
    wgmma_fence_regs(gb);
    if constexpr (T::kDqRed == 1) {
      if (warp == 0) bulk_wait_read<0>();  // the previous block's dQ rows have left the staging tile
    }
    if constexpr (SPLIT != 2 || STAGES == 1 || T::kDqRed == 1 || T::kDqRed == 3) {
      fence_proxy_async();
      __syncthreads();  // dS^T complete for every warpgroup; STAGES 1, DQ_RED 3: Q_i, dO_i free; DQ_RED 1: staging free
    }
    if constexpr (STAGES == 1) {
      if (t + 1 < m_count) load_block(m_block(t + 1), 0);
      cp_async_commit();
    }

    // dQ piece: rows dq_m .. dq_m+63 of the block, columns dq_c .. dq_c+DQC-1 in chunks of T::kDqChunk
    // (registers); A = dS (M-major view of dS^T), B = K (MN-major), k over the BN keys.
    const float scale = p.scale;
    float* dq_tile = reinterpret_cast<float*>(fa2_wgmma_bwd_smem + (q_tile(s) - k_tile));  // DQ_RED 3: [BM][D], swizzled
#pragma unroll
    for (int c0 = 0; c0 < DQC; c0 += DQ_CHUNK) {
      float dq[DQ_CHUNK / 2];
      wgmma_fence_regs(dq);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
        wgmma_ss<DQ_CHUNK, DT, 1, 1>(dq, desc_mn_major<BM>(dst + 32 * BM * ks + 16 * dq_m),
                                     desc_mn_major<D>(kt + 32 * D * ks + 16 * (dq_c + c0)), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(dq);
      if constexpr (T::kDqRed == 3) {  // into the block's tile: piece c4 of row r at c4 ^ (r % 8), as in dq_accum
        // This thread's rows are g (mod 8): the pair at column 8j + 2 tig of the chunk (piece 2j + tig/2)
        // goes to piece 2 (j ^ g/2) + (tig/2 ^ g%2).
        float* row_g = dq_tile + (dq_m + wrow + g) * D + dq_c + c0 + 4 * ((tig >> 1) ^ (g & 1)) + 2 * (tig & 1);
#pragma unroll
        for (int j = 0; j < DQ_CHUNK / 8; ++j) {
          float* at = row_g + 8 * (j ^ (g >> 1));
          *reinterpret_cast<float2*>(at) = make_float2(scale * dq[4 * j], scale * dq[4 * j + 1]);
          *reinterpret_cast<float2*>(at + 8 * D) = make_float2(scale * dq[4 * j + 2], scale * dq[4 * j + 3]);
        }
      } else if constexpr (T::kDqRed == 2) {  // whole-line v4 reductions through this warp's staging tile
        det::reduce_staged<DQ_CHUNK, D>(dq_stage_warp, dq, scale,
                                        dq_accum + static_cast<long long>(m0 + dq_m + wrow) * D + dq_c + c0,
                                        seq_q - (m0 + dq_m + wrow), lane);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rb = dq_m + wrow + g + 8 * h;  // row in the block
          if constexpr (T::kDqRed == 0) {
            if (m0 + rb < seq_q) {
#pragma unroll
              for (int j = 0; j < DQ_CHUNK / 8; ++j)
                red_add_f32x2(dq_accum + static_cast<long long>(m0 + rb) * D + dq_c + c0 + 8 * j + 2 * tig,
                              scale * dq[4 * j + 2 * h], scale * dq[4 * j + 2 * h + 1]);
            }
          } else {
#pragma unroll
            for (int j = 0; j < DQ_CHUNK / 8; ++j)
              *reinterpret_cast<float2*>(dq_stage + rb * kDqStageRow + dq_c + c0 + 8 * j + 2 * tig) =
                  make_float2(scale * dq[4 * j + 2 * h], scale * dq[4 * j + 2 * h + 1]);
          }
        }
      }
    }
    if constexpr (T::kDqRed == 1) {  // the block's dQ rows (below seq_q), one bulk reduction each, by warp 0
      fence_proxy_async();
      __syncthreads();
      if (warp == 0) {  // left to run while the next block is computed: waited for before the next staging
        for (int r = lane; r < imin(BM, seq_q - m0); r += 32)
          bulk_reduce_add_f32(dq_accum + static_cast<long long>(m0 + r) * D, smem_u32(dq_stage + r * kDqStageRow), D * 4);
        bulk_commit();
      }
    }
    if constexpr (STAGES == 2) s ^= 1;
  }
  cp_async_wait<0>();  // nothing in flight at exit (no query block: K, V unused)
  if constexpr (T::kDqRed == 3) {  // the last block's dQ tile
    if (m_count > 0) {
      fence_proxy_async();
      __syncthreads();
      if (tid == 0) reduce_block(m_block(m_count - 1), s ^ 1);
    }
    if (tid == 0) bulk_wait<0>();
  }
  if (T::kDqRed == 1 && warp == 0) bulk_wait<0>();  // the last dQ rows reduced before shared memory goes

  // dK (times scale), dV rows; zeros for a block no query sees.
  unsigned short* dk_out = static_cast<unsigned short*>(p.dk) + bh * seq_k * D;
  unsigned short* dv_out = static_cast<unsigned short*>(p.dv) + bh * seq_k * D;
  const int row0 = n0 + kr0 + wrow + g;
  if constexpr (SPLIT == 1) {
    det::store_tile<DT, GA * 2, D>(wg == 0 ? dv_out : dk_out, ga, wg == 0 ? 1.f : p.scale, row0, 0, seq_k, tig);
  } else {
    det::store_tile<DT, GA * 2, D>(dv_out, ga, 1.f, row0, gc0, seq_k, tig);
    det::store_tile<DT, GB * 2, D>(dk_out, gb, p.scale, row0, gc0, seq_k, tig);
  }
}

}  // namespace flashtune
