// FlashAttention-2 backward on tensor cores (mma.sync m16n8k16), fp16 or bf16 in and out, fp32
// accumulation. Three kernels, launched in order:
//   fa2_mma_bwd_preprocess<T>  delta[i] = sum_c dO[i][c] O[i][c] (fp32); DQ_MODE 0: dq_accum = 0
//   fa2_mma_bwd_dkdv<T>        one CTA per K/V block: dK, dV; DQ_MODE 0 also dq_accum += scale dS K
//   fa2_mma_bwd_dq<T>          DQ_MODE 0: dQ = 16-bit(dq_accum); DQ_MODE 1: one CTA per query block,
//                              dQ = scale * sum_j dS_ij K_j in registers, fixed order (deterministic)
// with T = Fa2MmaBwdTraits<D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE, DTYPE, CAUSAL>.
// Threads, grid and dynamic shared memory of each kernel: fa2_mma_bwd_<kernel>_{threads,grid,
// smem_bytes} in fa2_mma_bwd_traits.h (checked at entry).
//
// dK/dV kernel. Scores are held TRANSPOSED, S^T = K Q^T (keys x queries), so that a warp's score
// rows are its dK/dV rows and P^T, dS^T never leave registers for dV and dK:
//   S^T  = K_j Q_i^T    A = K rows (ldmatrix from Ks), B = Q rows (ldmatrix from Qs)
//   dP^T = V_j dO_i^T   A = V rows, B = dO rows
//   P^T  = exp2(S^T scale_log2 - lse_i log2 e), dS^T = P^T (dP^T - delta_i)   (per query column)
//   dV  += P^T dO_i     A = the P^T accumulators packed to 16 bits (C layout of n8 tiles 2k, 2k+1
//                       = A layout of k16 slice k), B = dO by ldmatrix.trans
//   dK  += dS^T Q_i     likewise; dK *= scale once at the end
//   DQ_MODE 0: dS^T (16-bit) to shared memory, barrier, dQ_i = dS K_j by a second warp tiling
//   (A = dS by ldmatrix.trans of dS^T, B = K by ldmatrix.trans), fp32 reductions into dq_accum.
// Q_i, dO_i, lse_i and delta_i arrive by cp.async, STAGES = 2: block i+1 lands during block i.
// DQ_MODE 1 dQ kernel: the forward's layout (warps own query rows): S = Q K^T, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K with dS packed from the accumulators; K/V blocks of KS keys.
//
// Packed variable-length batches: kernel<T, true> (AttnBwdParams::cu_seqlens_q/k) take their sequence's
// lengths and offsets (VarlenSeq, z = the sequence), token-major rows of H*D (Hk*D) elements, delta and
// lse (H, total_q), dq_accum laid out like dQ; a CTA whose block starts past its sequence's end exits,
// and keys of a sequence without queries get dK = dV = 0. The loops are the dense ones.
//
// Masking: rows past seq_q / seq_k are zero-filled in shared memory (lse and delta too), which
// makes every contribution of a padded query row zero (dO = 0 gives dV += 0, dP = 0, dS = 0).
// Keys past seq_k and (causal, bottom-right) keys j > i + (seq_k - seq_q) get P = 0, only in tiles
// that straddle the seq_k end or the diagonal. A fully masked row has lse = +inf: P = 0.
//
// Score modifications (issue 32), every kernel on AttnModTraits<T, WINDOW, SOFTCAP, ALIBI> (Fa2BwdArg: ModParams,
// the plain argument then AttnMods; the preprocess and DQ_MODE 0's conversion read only the plain part), fa3_wgmma_bwd's
// design on these loops; the plain kernels' code is unchanged. WINDOW: query m sees key n iff m + lo <= n <= m + hi
// (WindowBand); a K/V block's CTA walks only the query blocks whose rows see one of its keys
// (fa2_mma_bwd_window_query_blocks), so that its steps scale with the window, and a block no row sees writes dK = dV =
// 0; DQ_MODE 0's atomics then add only the visited pairs (a query block no key block meets keeps dq_accum = 0), and
// DQ_MODE 1's dQ pass reads only the key steps its rows see (fa2_mma_bwd_window_key_blocks, from the first of them);
// both mask per element only the tiles that straddle an edge of the band or seq_k for some element of the warp
// (fa2_mma_bwd_window_masks). SOFTCAP: the forward's LSE is of the capped scores, so P = exp2(t c log2(e) - lse log2(e))
// with t = tanh(S scale / c) (tanh.approx), and dS = P (dP - delta) (1 - t^2), scaled by `scale` in dK and dQ as
// before. ALIBI: the forward's LSE includes b = -slope |m + seq_k - seq_q - n|, added to the exponent in S's units
// (alibi_unit: 1 / scale, or 1 / c on t); b depends on neither Q nor K, so dS keeps its form. The dK/dV kernel reads
// the slope of each step's query head (a kv head's group walks several). ModGrads does all three per element.
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa2_mma_bwd_traits.h"

namespace flashtune {

namespace fa2_mma_bwd_detail {

// Byte offset of 16-byte chunk c of row r in a tile of RB-byte rows.
template <int RB>
__device__ __forceinline__ unsigned chunk_off(int r, int c) {
  return static_cast<unsigned>(r * RB + 16 * c);
}

// Rows [row0, row0+ROWS) of a (seq, D) 16-bit matrix with rows `stride` elements apart (D dense, H*D
// or Hk*D packed) into a padded tile (row bytes 2*(D+8)) with 16-byte cp.async; rows >= seq are
// zero-filled (src-size 0, source clamped to the base).
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short* src, int stride, int row0, int seq,
                                          int tid) {
  constexpr int CPR = D / 8;
  constexpr int RB = fa2_mma_bwd_row_bytes(D);
  constexpr int kChunks = ROWS * CPR;
  constexpr int kIters = ceil_div(kChunks, NT);
  auto one = [&](int it) {
    const int idx = tid + it * NT;
    if (kChunks % NT == 0 || idx < kChunks) {
      const int r = idx / CPR;
      const int c = idx % CPR;
      const int grow = row0 + r;
      const bool ok = grow < seq;
      const unsigned short* g = ok ? src + static_cast<long long>(grow) * stride + 8 * c : src;
      cp_async_16_s(dst + chunk_off<RB>(r, c), g, ok ? 16 : 0);
    }
  };
  if constexpr (kIters <= 8) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) one(it);
  } else {
    // Few threads, many chunks (1-2 warp CTAs): a rolled loop, or ptxas keeps every address live.
#pragma unroll 4
    for (int it = 0; it < kIters; ++it) one(it);
  }
}

// lse[row0 .. row0+ROWS) and delta[...] (fp32) into two ROWS-float arrays; past seq zero-filled.
template <int ROWS, int NT>
__device__ __forceinline__ void load_stats(unsigned dst_lse, unsigned dst_delta, const float* lse,
                                           const float* delta, int row0, int seq, int tid) {
#pragma unroll
  for (int it = 0; it < ceil_div(2 * ROWS, NT); ++it) {
    const int idx = tid + it * NT;
    if ((2 * ROWS) % NT == 0 || idx < 2 * ROWS) {
      const bool is_lse = idx < ROWS;
      const int r = is_lse ? idx : idx - ROWS;
      const bool ok = row0 + r < seq;
      const float* src = is_lse ? lse : delta;
      cp_async_4_s((is_lse ? dst_lse : dst_delta) + 4 * r, ok ? src + row0 + r : src, ok ? 4 : 0);
    }
  }
}

template <int A, int B>
__device__ __forceinline__ void zero_tiles(float (&x)[A][B][4]) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[a][b][e] = 0.f;
}

// A fragments of k16 slice kk from the C accumulators of n8 tiles 2kk, 2kk+1.
template <int DTYPE, int MT, int NTL>
__device__ __forceinline__ void pack_a(unsigned (&a)[MT][4], const float (&c)[MT][NTL][4], int kk) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    a[mt][0] = pack_half2<DTYPE>(c[mt][2 * kk][0], c[mt][2 * kk][1]);
    a[mt][1] = pack_half2<DTYPE>(c[mt][2 * kk][2], c[mt][2 * kk][3]);
    a[mt][2] = pack_half2<DTYPE>(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
    a[mt][3] = pack_half2<DTYPE>(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
  }
}

// acc[mt][dt] += C(MT m16 tiles x K) * Y (K x NCOL), C given as 16-bit A fragments packed from
// fp32 accumulators c[MT][K/8][4]; Y rows from a padded tile by ldmatrix.trans at y_lane (the
// per-lane address of row lane%16, chunk lane/16 of the first column).
template <int DTYPE, int MT, int K, int NCOL, int RB>
__device__ __forceinline__ void gemm_regs_by_tile(float (&acc)[MT][NCOL / 8][4], const float (&c)[MT][K / 8][4],
                                                  unsigned y_lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned a[MT][4];
    pack_a<DTYPE, MT, K / 8>(a, c, kk);
#pragma unroll
    for (int dp = 0; dp < NCOL / 16; ++dp) {
      unsigned b[4];
      ldmatrix_x4_trans(b, y_lane + static_cast<unsigned>(16 * kk * RB + 32 * dp));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<DTYPE>(acc[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816<DTYPE>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Two products sharing the k loop: c1 = X1 Y1^T, c2 = X2 Y2^T over D (X: MT m16 row tiles at
// x*_lane, a-pattern; Y: N rows at y*_lane, b-pattern of non-transposed B).
template <int DTYPE, int MT, int N, int D, int RB>
__device__ __forceinline__ void gemm_two_abt(float (&c1)[MT][N / 8][4], float (&c2)[MT][N / 8][4], unsigned x1_lane,
                                             unsigned y1_lane, unsigned x2_lane, unsigned y2_lane) {
  zero_tiles(c1);
  zero_tiles(c2);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    unsigned a1[MT][4], a2[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      ldmatrix_x4(a1[mt], x1_lane + static_cast<unsigned>(16 * mt * RB + 32 * ks));
      ldmatrix_x4(a2[mt], x2_lane + static_cast<unsigned>(16 * mt * RB + 32 * ks));
    }
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned b1[4], b2[4];
      ldmatrix_x4(b1, y1_lane + static_cast<unsigned>(16 * np * RB + 32 * ks));
      ldmatrix_x4(b2, y2_lane + static_cast<unsigned>(16 * np * RB + 32 * ks));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<DTYPE>(c1[mt][2 * np], a1[mt], b1[0], b1[1]);
        mma_16816<DTYPE>(c1[mt][2 * np + 1], a1[mt], b1[2], b1[3]);
        mma_16816<DTYPE>(c2[mt][2 * np], a2[mt], b2[0], b2[1]);
        mma_16816<DTYPE>(c2[mt][2 * np + 1], a2[mt], b2[2], b2[3]);
      }
    }
  }
}

// Rows of m16 tiles (C layout: lane rows g, g+8, columns 2t, 2t+1 of each n8 tile) to a (seq, D)
// 16-bit matrix with rows `stride` elements apart, times mul, rows >= seq skipped.
template <int DTYPE, int MT, int NCOL, int D>
__device__ __forceinline__ void store_rows(unsigned short* out, int stride, const float (&acc)[MT][NCOL / 8][4], float mul,
                                           int row_base, int col_base, int seq) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_base + 16 * mt + 8 * h;
      if (r < seq) {
#pragma unroll
        for (int dt = 0; dt < NCOL / 8; ++dt)
          *reinterpret_cast<unsigned*>(out + static_cast<long long>(r) * stride + col_base + 8 * dt) =
              pack_half2<DTYPE>(acc[mt][dt][2 * h] * mul, acc[mt][dt][2 * h + 1] * mul);
      }
    }
}

// A modified kernel's per-element P and dS (ModsOf<T>::any), in place of S and dP: x = S, or t = tanh(S cap_scale)
// with dP - delta times 1 - t^2 (SOFTCAP); x += neg_slope |dist| (ALIBI); P = exp2(x scale_log2 + nl), 0 where
// masked; dS = P (dP - delta)[(1 - t^2)]. scale_log2 is SOFTCAP's c log2(e), else the plain scale's.
template <class T>
struct ModGrads {
  WindowBand band{0, 0};  // WINDOW: row m sees key n iff m + lo <= n <= m + hi
  float scale_log2 = 0.f;
  float cap_scale = 0.f;  // SOFTCAP: scale / c
  float neg_slope = 0.f;  // ALIBI: -slope alibi_unit of the head at hand
  template <class P>
  __device__ static ModGrads of(const P& p, int seq_q, int seq_k) {
    ModGrads m;
    m.scale_log2 = p.scale_log2;
    if constexpr (ModsOf<T>::window)
      m.band = window_band(p.mods.window_left, p.mods.window_right, T::kCausal, seq_q, seq_k);
    if constexpr (ModsOf<T>::softcap) m.scale_log2 = p.mods.softcap_log2, m.cap_scale = p.mods.softcap_scale;
    return m;
  }
  template <class P>
  __device__ void set_head(const P& p, int batch, int hq) {
    if constexpr (ModsOf<T>::alibi)
      neg_slope = -p.mods.alibi_slopes[batch * p.mods.alibi_batch_stride + hq] * p.mods.alibi_unit;
  }
  // Whether (query m, key n) is masked out: past seq_k, outside the band (WINDOW), else past the causal diagonal.
  __device__ bool masked(int m, int n, int seq_k, int causal_offset) const {
    if constexpr (ModsOf<T>::window) return n >= seq_k || n < m + band.lo || n > m + band.hi;
    else return n >= seq_k || (T::kCausal && n > m + causal_offset);
  }
  // One element: s (S) becomes P, dp (dP) becomes dS; dist = m + seq_k - seq_q - n (ALIBI), nl = -lse log2(e).
  __device__ __forceinline__ void apply(float& s, float& dp, float nl, float dl, float dist, bool out) const {
    float x = s, g = dp - dl;
    if constexpr (ModsOf<T>::softcap) {
      x = tanh_approx(x * cap_scale);
      g *= fmaf(-x, x, 1.f);
    }
    if constexpr (ModsOf<T>::alibi) x = fmaf(neg_slope, fabsf(dist), x);
    float pv = fast_exp2(fmaf(x, scale_log2, nl));
    if (out) pv = 0.f;
    s = pv;
    dp = pv * g;
  }
};

// The first key of the dQ pass's step nb (KS keys): WINDOW, nb steps after the span's first key (key0); plain, nb KS.
template <class T, int KS>
__device__ __forceinline__ int step_key(int key0, int nb) {
  if constexpr (ModsOf<T>::window) return key0 + nb * KS;
  else return nb * KS;
}

}  // namespace fa2_mma_bwd_detail

// The kernels' argument: the dense or packed params, with the modifications' values after them where the traits have
// any (ModParams). One name for it, as fa2_mma's Fa2FwdArg.
template <class Traits, bool VARLEN>
struct Fa2BwdArg {
  using type = typename ModParamsOf<ModsOf<Traits>::any, typename ParamsOf<VARLEN, AttnBwdParams>::type>::type;
};

// acc + the dot product of two 16-byte chunks of 16-bit values (dO and O), in fp32.
template <int DTYPE>
__device__ __forceinline__ float dot_chunk(uint4 a, uint4 b, float acc) {
  const unsigned aw[4] = {a.x, a.y, a.z, a.w};
  const unsigned bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float a0, a1, b0, b1;
    unpack_half2<DTYPE>(aw[w], a0, a1);
    unpack_half2<DTYPE>(bw[w], b0, b1);
    acc = fmaf(a0, b0, acc);
    acc = fmaf(a1, b1, acc);
  }
  return acc;
}

// delta[b,h,i] = sum_c dO[i][c] * O[i][c] in fp32; DQ_MODE 0 also zeroes dq_accum. 8 lanes per row,
// 16-byte loads.
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kPreThreads) fa2_mma_bwd_preprocess(const typename Fa2BwdArg<Traits, VARLEN>::type p) {
  using T = Traits;
  constexpr int D = T::kHeadDim;
  constexpr int L = T::kRowLanes;
  check_dynamic_smem(T::kPreSmemBytes);
  const int tid = threadIdx.x;
  const int g = tid % L;
  const int row = blockIdx.x * T::kRowsPerCta + tid / L;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, blockIdx.z);
  const bool ok = row < (VARLEN ? vs.seq_q : p.seq_q);
  const long long off = VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) + static_cast<long long>(row) * p.heads * D
                               : (bh * p.seq_q + row) * D;
  float acc = 0.f;
  if (ok) {
    const unsigned short* o = static_cast<const unsigned short*>(p.o) + off;
    const unsigned short* dout = static_cast<const unsigned short*>(p.dout) + off;
#pragma unroll
    for (int c = g; c < D / 8; c += L)
      acc = dot_chunk<T::kDtype>(*reinterpret_cast<const uint4*>(dout + 8 * c), *reinterpret_cast<const uint4*>(o + 8 * c), acc);
    if constexpr (T::kDqMode == 0) {
#pragma unroll
      for (int c = g; c < D / 4; c += L)
        *reinterpret_cast<float4*>(p.dq_accum + off + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  acc = group_sum<L>(acc);  // every lane takes part (no early exit before the shuffles)
  if (ok && g == 0) p.delta[VARLEN ? vs.lse_offset(blockIdx.y) + row : bh * p.seq_q + row] = acc;
}

// One CTA per K/V block j (x), head (y), batch (z): dK_j, dV_j over every query block i that can
// see the block, in increasing i; DQ_MODE 0 also dq_accum[i] += scale * dS_ij K_j.
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kDkdvThreads, 1) fa2_mma_bwd_dkdv(const typename Fa2BwdArg<Traits, VARLEN>::type p) {
  using T = Traits;
  namespace det = fa2_mma_bwd_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int NT = T::kDkdvThreads;
  constexpr int MTN = T::kKeyTiles;
  constexpr int DC = T::kDCols;
  constexpr int RB = T::kRowBytes;
  constexpr int SB = T::kDsRowBytes;
  constexpr int STAGES = T::kStages;
  constexpr int DT = T::kDtype;
  constexpr bool CAUSAL = T::kCausal;
  check_dynamic_smem(T::kDkdvSmemBytes);

  extern __shared__ __align__(128) unsigned char fa2_mma_bwd_smem[];
  const unsigned k_tile = smem_u32(fa2_mma_bwd_smem);              // Ks [BN][D+8]
  const unsigned v_tile = k_tile + BN * RB;                        // Vs [BN][D+8]
  const unsigned qdo_base = v_tile + BN * RB;                      // STAGES x {Qs, dOs} [BM][D+8]
  const unsigned ds_tile = qdo_base + STAGES * 2 * BM * RB;        // dS^T [BN][BM+8] (DQ_MODE 0)
  constexpr int kStatsOff = 2 * BN * RB + STAGES * 2 * BM * RB + (T::kDqMode == 0 ? BN * SB : 0);
  const float* stats = reinterpret_cast<const float*>(fa2_mma_bwd_smem + kStatsOff);  // STAGES x {lse, delta} [BM]
  const unsigned stats_s = k_tile + kStatsOff;
  auto q_tile = [&](int s) { return qdo_base + static_cast<unsigned>(s * 2 * BM * RB); };
  auto do_tile = [&](int s) { return qdo_base + static_cast<unsigned>(s * 2 * BM * RB + BM * RB); };

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int kr0 = (warp / T::kDSplit) * 16 * MTN;  // first key row of this warp
  const int dc0 = (warp % T::kDSplit) * DC;        // first dK/dV column of this warp

  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, blockIdx.z);
  const int seq_q = VARLEN ? vs.seq_q : p.seq_q;
  const int seq_k = VARLEN ? vs.seq_k : p.seq_k;
  const int n0 = blockIdx.x * BN;
  if (n0 >= seq_k) return;  // whole block: safe before any barrier
  // One CTA per kv head (y): grouped-query attention sums dK, dV over the group's query heads, so the
  // loop below runs over (query head of the group, query block) pairs.
  const int group = query_group(p);
  const int q_stride = VARLEN ? p.heads * D : D;  // packed: a token's row of every head
  const int k_stride = VARLEN ? (p.heads / group) * D : D;
  const long long bh_kv = static_cast<long long>(blockIdx.z) * (p.heads / group) + blockIdx.y;
  const long long bh_q0 = static_cast<long long>(blockIdx.z) * p.heads + static_cast<long long>(blockIdx.y) * group;
  const unsigned short* k =
      static_cast<const unsigned short*>(p.k) + (VARLEN ? vs.k_offset(p.heads / group, blockIdx.y, D) : bh_kv * seq_k * D);
  const unsigned short* v =
      static_cast<const unsigned short*>(p.v) + (VARLEN ? vs.k_offset(p.heads / group, blockIdx.y, D) : bh_kv * seq_k * D);
  const float scale_log2 = p.scale_log2;

  // Query i sees key n iff n <= i + causal_offset: only query blocks reaching row n0 - causal_offset.
  const int causal_offset = seq_k - seq_q;
  const int num_m_blocks = ceil_div(seq_q, BM);
  int first_m_block = CAUSAL ? imax(0, n0 - causal_offset) / BM : 0;
  int blocks_per_head = num_m_blocks - first_m_block;
  // Modified: the scores' constants; WINDOW walks only the query blocks whose rows see a key of the block (none: dK =
  // dV = 0 below).
  [[maybe_unused]] det::ModGrads<T> mod{};
  if constexpr (ModsOf<T>::any) {
    mod = det::ModGrads<T>::of(p, seq_q, seq_k);
    if constexpr (ModsOf<T>::window) {
      const IndexRange mbs = fa2_mma_bwd_window_query_blocks(mod.band, n0, BM, BN, seq_q, seq_k);
      first_m_block = mbs.first;
      blocks_per_head = mbs.end - mbs.first;
    }
  }
  const int num_steps = group * blocks_per_head;  // step t: query head t / blocks_per_head of the group
  auto head_of = [&](int t) { return bh_q0 + t / blocks_per_head; };
  auto block_of = [&](int t) { return first_m_block + t % blocks_per_head; };

  // Per-lane ldmatrix offsets: A / trans-B pattern (row lane%16, chunk lane/16) and non-trans B /
  // trans-A pattern (row lane%8 + 8*(lane/16), chunk (lane/8)%2).
  const unsigned a_off = det::chunk_off<RB>(lane & 15, lane >> 4);
  const unsigned b_off = det::chunk_off<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

  // Packed: query head y * group + t / blocks_per_head of this sequence (its rows q_stride apart).
  auto packed_head = [&](int t) { return static_cast<int>(blockIdx.y) * group + t / blocks_per_head; };
  auto load_block = [&](int t, int s) {
    const long long bh = head_of(t);
    const int mb = block_of(t);
    const unsigned short* q =
        static_cast<const unsigned short*>(p.q) + (VARLEN ? vs.q_offset(p.heads, packed_head(t), D) : bh * seq_q * D);
    const unsigned short* dout =
        static_cast<const unsigned short*>(p.dout) + (VARLEN ? vs.q_offset(p.heads, packed_head(t), D) : bh * seq_q * D);
    det::load_rows<BM, D, NT>(q_tile(s), q, q_stride, mb * BM, seq_q, tid);
    det::load_rows<BM, D, NT>(do_tile(s), dout, q_stride, mb * BM, seq_q, tid);
    det::load_stats<BM, NT>(stats_s + 8 * s * BM, stats_s + 8 * s * BM + 4 * BM,
                            p.lse + (VARLEN ? vs.lse_offset(packed_head(t)) : bh * seq_q),
                            p.delta + (VARLEN ? vs.lse_offset(packed_head(t)) : bh * seq_q), mb * BM, seq_q, tid);
  };

  float dk[MTN][DC / 8][4], dv[MTN][DC / 8][4];
  det::zero_tiles(dk);
  det::zero_tiles(dv);

  det::load_rows<BN, D, NT>(k_tile, k, k_stride, n0, seq_k, tid);
  det::load_rows<BN, D, NT>(v_tile, v, k_stride, n0, seq_k, tid);
  if (num_steps > 0) load_block(0, 0);
  cp_async_commit();

  int s = 0;
  for (int t = 0; t < num_steps; ++t) {
    const int m0 = block_of(t) * BM;
    cp_async_wait<0>();  // step t's block (K, V too on the first pass)
    __syncthreads();     // visible to all; everyone done with step t-1 (its slot, dS^T)
    if constexpr (STAGES == 2) {
      if (t + 1 < num_steps) load_block(t + 1, s ^ 1);
      cp_async_commit();
    }

    // S^T = K Q^T and dP^T = V dO^T for this warp's key rows, all BM query columns.
    float st[MTN][BM / 8][4], dpt[MTN][BM / 8][4];
    det::gemm_two_abt<DT, MTN, BM, D, RB>(st, dpt, k_tile + kr0 * RB + a_off, q_tile(s) + b_off,
                                          v_tile + kr0 * RB + a_off, do_tile(s) + b_off);

    // P^T and dS^T in place.
    if constexpr (ModsOf<T>::any) {
      const float* lse_s = stats + 2 * s * BM;
      const float* dl_s = lse_s + BM;
      // Modified (ModGrads): the step's query head's slope (ALIBI); the mask where some element of the warp's key
      // rows and the block's queries needs it (WINDOW: straddling the band or seq_k).
      mod.set_head(p, blockIdx.z, packed_head(t));
      bool masked;
      if constexpr (ModsOf<T>::window)
        masked = fa2_mma_bwd_window_masks(mod.band, m0, BM, n0 + kr0, 16 * MTN, seq_k);
      else
        masked = (n0 + BN > seq_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset);
      // Element (mt, nt, e): key n0 + kr0 + 16 mt + g + 8 (e >> 1), query m0 + 8 nt + 2 tig + (e & 1).
      const int d0 = m0 + 2 * tig + causal_offset - (n0 + kr0 + g);
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * nt + 2 * tig);
        const float2 d2 = *reinterpret_cast<const float2*>(dl_s + 8 * nt + 2 * tig);
        const float nl[2] = {-l2.x * kLog2e, -l2.y * kLog2e};
        const float dl[2] = {d2.x, d2.y};
#pragma unroll
        for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int dn = 16 * mt + 8 * (e >> 1), dm = 8 * nt + (e & 1);
            const bool out = masked && mod.masked(m0 + 2 * tig + dm, n0 + kr0 + g + dn, seq_k, causal_offset);
            mod.apply(st[mt][nt][e], dpt[mt][nt][e], nl[e & 1], dl[e & 1], static_cast<float>(d0 + dm - dn), out);
          }
      }
    } else {
    const bool needs_mask = (n0 + BN > seq_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset);
    const float* lse_s = stats + 2 * s * BM;
    const float* dl_s = lse_s + BM;
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * nt + 2 * tig);
      const float2 d2 = *reinterpret_cast<const float2*>(dl_s + 8 * nt + 2 * tig);
      const float nl[2] = {-l2.x * kLog2e, -l2.y * kLog2e};
      const float dl[2] = {d2.x, d2.y};
#pragma unroll
      for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pv = fast_exp2(fmaf(st[mt][nt][e], scale_log2, nl[e & 1]));
          if (needs_mask) {
            const int n = n0 + kr0 + 16 * mt + g + 8 * (e >> 1);
            const int m = m0 + 8 * nt + 2 * tig + (e & 1);
            if (n >= seq_k || (CAUSAL && n > m + causal_offset)) pv = 0.f;
          }
          st[mt][nt][e] = pv;
          dpt[mt][nt][e] = pv * (dpt[mt][nt][e] - dl[e & 1]);
        }
    }
    }  // (the plain kernels' lines as they were)

    if constexpr (T::kDqMode == 0) {
      // dS^T (16-bit) for the dQ product; the DSPLIT warps of a key group hold the same values.
      if (warp % T::kDSplit == 0) {
#pragma unroll
        for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
          for (int nt = 0; nt < BM / 8; ++nt) {
            const unsigned r = ds_tile + static_cast<unsigned>((kr0 + 16 * mt + g) * SB + 2 * (8 * nt + 2 * tig));
            st_shared_u32(r, pack_half2<DT>(dpt[mt][nt][0], dpt[mt][nt][1]));
            st_shared_u32(r + 8 * SB, pack_half2<DT>(dpt[mt][nt][2], dpt[mt][nt][3]));
          }
      }
    }

    // dV += P^T dO, dK += dS^T Q over this warp's DC columns.
    det::gemm_regs_by_tile<DT, MTN, BM, DC, RB>(dv, st, do_tile(s) + a_off + 2 * dc0);
    det::gemm_regs_by_tile<DT, MTN, BM, DC, RB>(dk, dpt, q_tile(s) + a_off + 2 * dc0);

    if constexpr (T::kDqMode == 0 || STAGES == 1) __syncthreads();  // dS^T visible; slot s free (STAGES 1)
    if constexpr (STAGES == 1) {
      if (t + 1 < num_steps) load_block(t + 1, 0);
      cp_async_commit();
    }

    if constexpr (T::kDqMode == 0) {
      // dQ_i (BM x D) += dS K_j: warp (wm, wd) owns rows wm*RQ.., columns wd*CQ..
      constexpr int RQ = T::kDqaRows;
      constexpr int CQ = T::kDqaCols;
      constexpr int MQ = RQ / 16;
      const int qr0 = (warp / T::kDqaWarpsD) * RQ;
      const int qc0 = (warp % T::kDqaWarpsD) * CQ;
      float dqa[MQ][CQ / 8][4];
      det::zero_tiles(dqa);
      const unsigned ds_lane = ds_tile + det::chunk_off<SB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1) + 2 * qr0;
      const unsigned kt_lane = k_tile + a_off + 2 * qc0;
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks) {
        unsigned a[MQ][4];
#pragma unroll
        for (int mq = 0; mq < MQ; ++mq) ldmatrix_x4_trans(a[mq], ds_lane + static_cast<unsigned>(16 * ks * SB + 32 * mq));
#pragma unroll
        for (int dp = 0; dp < CQ / 16; ++dp) {
          unsigned b[4];
          ldmatrix_x4_trans(b, kt_lane + static_cast<unsigned>(16 * ks * RB + 32 * dp));
#pragma unroll
          for (int mq = 0; mq < MQ; ++mq) {
            mma_16816<DT>(dqa[mq][2 * dp], a[mq], b[0], b[1]);
            mma_16816<DT>(dqa[mq][2 * dp + 1], a[mq], b[2], b[3]);
          }
        }
      }
      float* dq_accum = p.dq_accum + (VARLEN ? vs.q_offset(p.heads, packed_head(t), D) : head_of(t) * seq_q * D);
      const float scale = p.scale;
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m0 + qr0 + 16 * mq + g + 8 * h;
          if (r < seq_q) {
#pragma unroll
            for (int dt = 0; dt < CQ / 8; ++dt)
              red_add_f32x2(dq_accum + static_cast<long long>(r) * q_stride + qc0 + 8 * dt + 2 * tig,
                            scale * dqa[mq][dt][2 * h], scale * dqa[mq][dt][2 * h + 1]);
          }
        }
    }
    if constexpr (STAGES == 2) s ^= 1;
  }
  cp_async_wait<0>();  // nothing in flight at exit (no query block: K, V unused)

  // dK (times scale), dV rows; zeros for a block no query sees.
  unsigned short* dk_out =
      static_cast<unsigned short*>(p.dk) + (VARLEN ? vs.k_offset(p.heads / group, blockIdx.y, D) : bh_kv * seq_k * D);
  unsigned short* dv_out =
      static_cast<unsigned short*>(p.dv) + (VARLEN ? vs.k_offset(p.heads / group, blockIdx.y, D) : bh_kv * seq_k * D);
  det::store_rows<DT, MTN, DC, D>(dk_out, k_stride, dk, p.scale, n0 + kr0 + g, dc0 + 2 * tig, seq_k);
  det::store_rows<DT, MTN, DC, D>(dv_out, k_stride, dv, 1.f, n0 + kr0 + g, dc0 + 2 * tig, seq_k);
}

// DQ_MODE 0: dQ = 16-bit(dq_accum) (row kernel). DQ_MODE 1: one CTA per query block (x, reversed
// when causal so the heaviest blocks start first), head (y), batch (z): dQ_i = scale * sum_j dS_ij K_j
// over the visible keys in increasing order, in registers; bitwise deterministic.
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kDqThreads, 1) fa2_mma_bwd_dq(const typename Fa2BwdArg<Traits, VARLEN>::type p) {
  using T = Traits;
  namespace det = fa2_mma_bwd_detail;
  constexpr int D = T::kHeadDim;
  constexpr int DT = T::kDtype;
  check_dynamic_smem(T::kDqSmemBytes);
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, blockIdx.z);
  const int seq_q = VARLEN ? vs.seq_q : p.seq_q;
  const int q_stride = VARLEN ? p.heads * D : D;  // packed: a token's row of every head
  const int tid = threadIdx.x;

  if constexpr (T::kDqMode == 0) {
    constexpr int L = T::kRowLanes;
    const int g = tid % L;
    const int row = blockIdx.x * T::kRowsPerCta + tid / L;
    if (row >= seq_q) return;  // no barriers in this kernel
    const long long off =
        VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) + static_cast<long long>(row) * q_stride : (bh * seq_q + row) * D;
    unsigned short* dq = static_cast<unsigned short*>(p.dq) + off;
    const float* acc = p.dq_accum + off;
    const int swz = T::kDqAccumSwizzled ? (row & 7) : 0;  // 16-byte piece c of the row stored at c ^ swz
#pragma unroll
    for (int c = g; c < D / 8; c += L) {
      const float4 x = *reinterpret_cast<const float4*>(acc + 4 * ((2 * c) ^ swz));
      const float4 y = *reinterpret_cast<const float4*>(acc + 4 * ((2 * c + 1) ^ swz));
      uint4 w;
      w.x = pack_half2<DT>(x.x, x.y);
      w.y = pack_half2<DT>(x.z, x.w);
      w.z = pack_half2<DT>(y.x, y.y);
      w.w = pack_half2<DT>(y.z, y.w);
      *reinterpret_cast<uint4*>(dq + 8 * c) = w;
    }
  } else {
    constexpr int BM = T::kBlockM;
    // A modified variant's key step may be shorter (its registers beside the accumulators; never 0 where the
    // plain one is not, as mods_max_head_dim keeps D <= 128), in the same shared memory as the plain one's.
    constexpr int KS = ModsOf<T>::any ? fa2_mma_bwd_dq_key_step(D, T::kBlockM, T::kBlockN, T::kWarps, true)
                                      : T::kDqKeyStep;
    static_assert(KS > 0 && KS <= T::kDqKeyStep, "the modified dQ pass's key step");
    constexpr int NT = T::kDqThreads;
    constexpr int MT = T::kDqMTiles;
    constexpr int RB = T::kRowBytes;
    constexpr int STAGES = T::kStages;
    constexpr bool CAUSAL = T::kCausal;
    extern __shared__ __align__(128) unsigned char fa2_mma_bwd_smem[];
    const unsigned q_tile = smem_u32(fa2_mma_bwd_smem);      // Qs [BM][D+8]
    const unsigned do_tile = q_tile + BM * RB;   // dOs [BM][D+8]
    const unsigned kv_base = do_tile + BM * RB;  // STAGES x {Ks, Vs} [KS][D+8]
    auto k_tile = [&](int s) { return kv_base + static_cast<unsigned>(s * 2 * KS * RB); };
    auto v_tile = [&](int s) { return kv_base + static_cast<unsigned>(s * 2 * KS * RB + KS * RB); };

    const int lane = tid & 31;
    const int g = lane >> 2;
    const int tig = lane & 3;
    const int qr0 = (tid >> 5) * 16 * MT;  // first block row of this warp
    const int seq_k = VARLEN ? vs.seq_k : p.seq_k;
    // Causal: heaviest blocks first (packed: within the sequence; blocks past its end exit).
    const int qblock = !CAUSAL ? static_cast<int>(blockIdx.x)
                       : VARLEN ? ceil_div(seq_q, BM) - 1 - static_cast<int>(blockIdx.x)
                                : static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const int m0 = qblock * BM;
    if (m0 >= seq_q || (VARLEN && m0 < 0)) return;  // whole block: safe before any barrier
    const unsigned short* q =
        static_cast<const unsigned short*>(p.q) + (VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) : bh * seq_q * D);
    const long long bh_kv = static_cast<long long>(blockIdx.z) * (p.heads / query_group(p)) + blockIdx.y / query_group(p);
    const unsigned short* k = static_cast<const unsigned short*>(p.k) +
                              (VARLEN ? vs.k_offset(p.heads / query_group(p), blockIdx.y / query_group(p), D) : bh_kv * seq_k * D);
    const unsigned short* v = static_cast<const unsigned short*>(p.v) +
                              (VARLEN ? vs.k_offset(p.heads / query_group(p), blockIdx.y / query_group(p), D) : bh_kv * seq_k * D);
    const unsigned short* dout =
        static_cast<const unsigned short*>(p.dout) + (VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) : bh * seq_q * D);
    const float scale_log2 = p.scale_log2;
    const int k_stride = VARLEN ? (p.heads / query_group(p)) * D : D;

    // Keys [0, kv_end) can be visible to some row of this block.
    const int causal_offset = seq_k - seq_q;
    int kv_end = seq_k;
    if (CAUSAL) kv_end = imin(seq_k, imin(m0 + BM, seq_q) + causal_offset);
    int num_n_blocks = kv_end > 0 ? ceil_div(kv_end, KS) : 0;
    // Modified: the scores' constants (this head's slope); WINDOW reads only the key steps its rows see, from key0.
    [[maybe_unused]] int key0 = 0;
    [[maybe_unused]] det::ModGrads<T> mod{};
    if constexpr (ModsOf<T>::any) {
      mod = det::ModGrads<T>::of(p, seq_q, seq_k);
      mod.set_head(p, blockIdx.z, blockIdx.y);
      if constexpr (ModsOf<T>::window) {
        const IndexRange ks = fa2_mma_bwd_window_key_blocks(mod.band, m0, BM, KS, seq_q, seq_k);
        num_n_blocks = ks.end - ks.first;
        key0 = ks.first * KS;
      }
    }

    // Row statistics of the lane's rows qr0 + 16mt + g + 8h; rows past seq_q: P = 0.
    float nl2[MT][2], dl[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + qr0 + 16 * mt + g + 8 * h;
        const bool ok = r < seq_q;
        nl2[mt][h] = ok ? -p.lse[(VARLEN ? vs.lse_offset(blockIdx.y) : bh * seq_q) + r] * kLog2e : neg_inf();
        dl[mt][h] = ok ? p.delta[(VARLEN ? vs.lse_offset(blockIdx.y) : bh * seq_q) + r] : 0.f;
      }

    const unsigned a_off = det::chunk_off<RB>(lane & 15, lane >> 4);
    const unsigned b_off = det::chunk_off<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    auto load_kv = [&](int nb, int s) {
      det::load_rows<KS, D, NT>(k_tile(s), k, k_stride, det::step_key<T, KS>(key0, nb), seq_k, tid);
      det::load_rows<KS, D, NT>(v_tile(s), v, k_stride, det::step_key<T, KS>(key0, nb), seq_k, tid);
    };

    float dq[MT][D / 8][4];
    det::zero_tiles(dq);
    det::load_rows<BM, D, NT>(q_tile, q, q_stride, m0, seq_q, tid);
    det::load_rows<BM, D, NT>(do_tile, dout, q_stride, m0, seq_q, tid);
    if (num_n_blocks > 0) load_kv(0, 0);
    cp_async_commit();

    int s = 0;
    for (int nb = 0; nb < num_n_blocks; ++nb) {
      int n0 = nb * KS;
      if constexpr (ModsOf<T>::window) n0 = det::step_key<T, KS>(key0, nb);  // (the plain loop's code as it was)
      cp_async_wait<0>();
      __syncthreads();  // block nb visible; everyone done with block nb-1's slot
      if constexpr (STAGES == 2) {
        if (nb + 1 < num_n_blocks) load_kv(nb + 1, s ^ 1);
        cp_async_commit();
      }
      float sc[MT][KS / 8][4], dp[MT][KS / 8][4];
      det::gemm_two_abt<DT, MT, KS, D, RB>(sc, dp, q_tile + qr0 * RB + a_off, k_tile(s) + b_off,
                                           do_tile + qr0 * RB + a_off, v_tile(s) + b_off);
      if constexpr (ModsOf<T>::any) {
        bool masked;
        if constexpr (ModsOf<T>::window)
          masked = fa2_mma_bwd_window_masks(mod.band, m0 + qr0, 16 * MT, n0, KS, seq_k);
        else
          masked = (n0 + KS > seq_k) || (CAUSAL && n0 + KS - 1 > m0 + qr0 + causal_offset);
        // Element (mt, nt, e): query m0 + qr0 + 16 mt + g + 8 (e >> 1), key n0 + 8 nt + 2 tig + (e & 1).
        const int d0 = m0 + qr0 + g + causal_offset - (n0 + 2 * tig);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < KS / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e >> 1, dm = 16 * mt + 8 * h, dn = 8 * nt + (e & 1);
              const bool out = masked && mod.masked(m0 + qr0 + g + dm, n0 + 2 * tig + dn, seq_k, causal_offset);
              mod.apply(sc[mt][nt][e], dp[mt][nt][e], nl2[mt][h], dl[mt][h], static_cast<float>(d0 + dm - dn), out);
            }
      } else {
      const bool needs_mask = (n0 + KS > seq_k) || (CAUSAL && n0 + KS - 1 > m0 + qr0 + causal_offset);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < KS / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            float pv = fast_exp2(fmaf(sc[mt][nt][e], scale_log2, nl2[mt][h]));
            if (needs_mask) {
              const int r = m0 + qr0 + 16 * mt + g + 8 * h;
              const int c = n0 + 8 * nt + 2 * tig + (e & 1);
              if (c >= seq_k || (CAUSAL && c > r + causal_offset)) pv = 0.f;
            }
            dp[mt][nt][e] = pv * (dp[mt][nt][e] - dl[mt][h]);
          }
      }  // (the plain kernels' lines as they were)
      det::gemm_regs_by_tile<DT, MT, KS, D, RB>(dq, dp, k_tile(s) + a_off);
      if constexpr (STAGES == 1) {
        __syncthreads();  // everyone done with slot 0
        if (nb + 1 < num_n_blocks) load_kv(nb + 1, 0);
        cp_async_commit();
      } else {
        s ^= 1;
      }
    }
    cp_async_wait<0>();
    unsigned short* dq_out =
        static_cast<unsigned short*>(p.dq) + (VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) : bh * seq_q * D);
    det::store_rows<DT, MT, D, D>(dq_out, q_stride, dq, p.scale, m0 + qr0 + g, 2 * tig, seq_q);
  }
}

}  // namespace flashtune
