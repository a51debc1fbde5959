// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16), fp16 or bf16 in and out,
// fp32 accumulation and softmax, fp32 natural-log LSE.
//   fa2_mma_fwd<Fa2MmaTraits<D, BLOCK_M, BLOCK_N, WARPS, STAGES, DTYPE, CAUSAL>>
// Grid: x = ceil(seq_q / BLOCK_M) query blocks (reversed when causal), y = heads, z = batch;
// 32*WARPS threads; kSmemBytes dynamic shared memory (checked at entry).
//   fa2_mma_fwd<Traits, true>: packed variable-length batches (AttnFwdParams::cu_seqlens_q/k): z = the
// sequence, seq_q/seq_k the longest lengths; a CTA takes its sequence's lengths and offsets
// (VarlenSeq), token-major rows of H*D (Hk*D) elements, and exits when its query block is past the
// sequence's end (causal: reversed within the sequence). The loop below is the same code.
//
// Warp w owns query rows [w*R, (w+1)*R) of the block, R = BM/WARPS = 16*MT. Per K/V block:
//   S = Q K^T     MT x BN/8 accumulator tiles; Q fragments from registers (kQInRegs) or by
//                 ldmatrix from Qs, K fragments by ldmatrix from Ks[BN][D] (K rows are the
//                 "column-major" B operand as stored);
//   mask          only on blocks that straddle the diagonal or the seq_k end;
//   softmax       row max/sum over the 4 lanes of a quad (2 shuffles), exp2 domain with the
//                 scale folded into one FFMA per score, l kept per lane until the epilogue;
//   O += P V      the S accumulators of n8 tiles 2j, 2j+1 are, packed to 16 bits, exactly the
//                 A fragment of k16 slice j: P never touches shared memory. V fragments by
//                 ldmatrix.trans from Vs[BN][D].
// Shared-memory rows are D/8 16-byte chunks, padded (D <= 128) or XOR-swizzled (D >= 192) so
// that the 8 row addresses of every ldmatrix phase hit distinct bank groups (SmemLayout).
//
// Score modifications (issue 32), fa2_mma_fwd<AttnModTraits<Traits, WINDOW, SOFTCAP, ALIBI>[, true]> (ModParams: the
// plain argument, then AttnMods), fa3_wgmma's design on this loop: WINDOW reads only the key blocks some row of the
// query block sees (kv_span: the loop starts at the first of them, block_key), so that a window's work scales with
// it, and masks per element only the blocks that straddle an edge of the band for some row of the warp (mask_window);
// SOFTCAP maps S to tanh(S scale / c) (tanh.approx) before the mask, c log2(e) then being the exp2-domain scale of
// the softmax and the LSE (the LSE of the capped scores, as the backward reads it); ALIBI adds -slope |i + seq_k -
// seq_q - j| (in S's units: slope / scale, or slope / c after a softcap) to every element before the mask
// (add_alibi). modify_scores does all three in that order. The plain kernels' code is unchanged.
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa2_mma_traits.h"

namespace flashtune {

namespace fa2_mma_detail {


// Shared-memory tile layout for head dim D (rows of CPR = D/8 16-byte chunks, stride RB).
// Padded (D <= 128): chunk c of row r at r*RB + 16c, RB = 2*(D+8); CPR+1 is odd, so the 8 rows
// of an ldmatrix phase (same c) fall in 8 distinct 16-byte bank groups.
// Swizzled (D >= 192): RB = 2*D, chunk c stored at c ^ key(r), key(r) = r & 7 for CPR % 8 == 0.
// (For CPR % 8 == 4, i.e. D = 32 or 96 if ever swizzled, a row is half a 128-byte line, so the
// key is ((r >> 1) & 3): r&1 picks the half line, the key the chunk in aligned groups of 4.)
// ldmatrix addressing, pattern "lane reads row row0 + lrow, chunk 2*ks + cb" with row0 a
// multiple of 8 (so the key depends on lrow alone): base = tile + lane_base(lrow, cb), then
//   padded:   base + 32*ks + row0*RB
//   swizzled: (base ^ 32*(ks & M)) + 32*(ks & ~M) + row0*RB,   M = 3 (CPR % 8 == 0) or 1,
// since the key only permutes chunk bits inside an aligned group; the XOR form needs tile
// bases aligned to 128 bytes (checked at kernel entry for the shared-memory base).
// SWIZZLED: fa2_mma's choice by default; a family that streams its tiles at HBM bandwidth takes the swizzled
// form at every D (decode_splitkv): a padded row starts 16 bytes off a 32-byte boundary every other row, and
// the copy engine then fetches the sectors it straddles twice (decode_splitkv_traits.h).
template <int D, bool SWIZZLED = fa2_mma_swizzled(D)>
struct SmemLayout {
  static constexpr int CPR = D / 8;
  static constexpr bool kSwizzled = SWIZZLED;
  static constexpr int RB = kSwizzled ? 2 * D : 2 * (D + 8);
  static constexpr int kMask = (CPR % 8 == 0) ? 3 : 1;
  __device__ __forceinline__ static int key(int r) { return (CPR % 8 == 0) ? (r & 7) : ((r >> 1) & 3); }
  // Byte offset of chunk c of row r.
  __device__ __forceinline__ static unsigned offset(int r, int c) {
    return static_cast<unsigned>(r * RB + 16 * (kSwizzled ? (c ^ key(r)) : c));
  }
  __device__ __forceinline__ static unsigned lane_base(int lrow, int cb) { return offset(lrow, cb); }
  // ROW0, KS compile-time after unrolling.
  __device__ __forceinline__ static unsigned at(unsigned base, int row0, int ks) {
    if constexpr (kSwizzled)
      return (base ^ static_cast<unsigned>(32 * (ks & kMask))) + static_cast<unsigned>(32 * (ks & ~kMask) + row0 * RB);
    else
      return base + static_cast<unsigned>(32 * ks + row0 * RB);
  }
};

// Rows [row0, row0+ROWS) of a (seq, D) 16-bit matrix with rows `stride` elements apart (D dense,
// H*D packed) into a smem tile with 16-byte cp.async; rows >= seq are zero-filled (src-size 0, source
// clamped to row 0), never stale. When NT is a multiple of the chunks per row, each thread copies one
// fixed chunk column of rows tid/CPR + it*NT/CPR: one pointer and one smem offset per thread, the rest
// immediates (dense: stride is the constant D).
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(unsigned dst, const unsigned short* src, int stride, int row0, int seq,
                                                int tid) {
  using L = SmemLayout<D>;
  constexpr int CPR = D / 8;
  constexpr int kChunks = ROWS * CPR;
  if constexpr (NT % CPR == 0) {
    constexpr int kRowStep = NT / CPR;
    // A row step that is a multiple of 8 keeps the swizzle key; otherwise recompute.
    constexpr bool kSameKey = !L::kSwizzled || kRowStep % 8 == 0;
    const int r0 = tid / CPR;
    const int c = tid % CPR;
    const unsigned short* g = src + static_cast<long long>(row0 + r0) * stride + 8 * c;
    const unsigned s0 = dst + L::offset(r0, c);
#pragma unroll
    for (int it = 0; it < ceil_div(ROWS, kRowStep); ++it) {
      const int r = r0 + it * kRowStep;
      if (ROWS % kRowStep == 0 || r < ROWS) {
        const bool ok = row0 + r < seq;
        const unsigned sa = kSameKey ? s0 + static_cast<unsigned>(it * kRowStep * L::RB) : dst + L::offset(r, c);
        cp_async_16_s(sa, ok ? g + static_cast<long long>(it) * kRowStep * stride : src, ok ? 16 : 0);
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < ceil_div(kChunks, NT); ++it) {
      const int idx = tid + it * NT;
      if (kChunks % NT == 0 || idx < kChunks) {
        const int r = idx / CPR;
        const int c = idx % CPR;
        const int grow = row0 + r;
        const bool ok = grow < seq;
        const unsigned short* g = src + (ok ? static_cast<long long>(grow) * stride + 8 * c : 0);
        cp_async_16_s(dst + L::offset(r, c), g, ok ? 16 : 0);
      }
    }
  }
}

// S[mt][nt] = Q(rows of m-tile mt) K(keys of n8 tile nt)^T over all D, raw (unscaled) scores.
template <class T>
__device__ __forceinline__ void gemm_qk(float (&s)[T::kMTiles][T::kSTiles][4],
                                        const unsigned (&qf)[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kQkSlices : 1][4],
                                        unsigned q_base, unsigned k_base) {
  using A = SmemLayout<T::kHeadDim, T::kSwizzled>;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < T::kQkSlices; ++ks) {
    unsigned a[T::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      if constexpr (T::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][ks][e];
      } else {
        ldmatrix_x4(a[mt], A::at(q_base, 16 * mt, ks));
      }
    }
#pragma unroll
    for (int np = 0; np < T::kSTiles / 2; ++np) {
      // Keys 16np + lane%8 + 8*(lane/16), chunk 2ks + (lane/8)%2: b[0], b[1] = n8 tile 2np
      // (k 0-7, 8-15), b[2], b[3] = n8 tile 2np+1 (register pairs, as HMMA wants them).
      unsigned b[4];
      ldmatrix_x4(b, A::at(k_base, 16 * np, ks));
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
        mma_16816<T::kDtype>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<T::kDtype>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// -inf where key j is past seq_k or (causal) j > i + causal_offset. Lane holds rows
// row_g + 16*mt + {0, 8} and columns col_t + 8*nt + {0, 1}.
template <class T>
__device__ __forceinline__ void apply_mask(float (&s)[T::kMTiles][T::kSTiles][4], int row_g, int col_t, int seq_k,
                                           int causal_offset) {
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = row_g + 16 * mt + 8 * (e >> 1);
        const int j = col_t + 8 * nt + (e & 1);
        if (j >= seq_k || (T::kCausal && j > i + causal_offset)) s[mt][nt][e] = neg_inf();
      }
}

// The K/V blocks a query block reads: [first, first + count). Plain: from block 0, every key, or causal, the keys up
// to its last row's diagonal. WINDOW: only the blocks some row of the query block sees (fa2_mma_window_blocks), so
// that blocks wholly outside the window are neither loaded nor multiplied.
template <class T, class P>
__device__ __forceinline__ BlockSpan kv_span(const P& p, int m0, int seq_q, int seq_k) {
  if constexpr (ModsOf<T>::window) {
    const WindowBand band = window_band(p.mods.window_left, p.mods.window_right, T::kCausal, seq_q, seq_k);
    return fa2_mma_window_blocks(band, m0, T::kBlockM, T::kBlockN, seq_q, seq_k);
  } else {
    const int kv_end = T::kCausal ? imin(seq_k, imin(m0 + T::kBlockM, seq_q) + seq_k - seq_q) : seq_k;
    return {0, kv_end > 0 ? ceil_div(kv_end, T::kBlockN) : 0};
  }
}

// The first key of the loop's block nb: WINDOW, nb blocks after the span's first key (key0); plain, block nb.
template <class T>
__device__ __forceinline__ int block_key(int key0, int nb) {
  if constexpr (ModsOf<T>::window) return key0 + nb * T::kBlockN;
  else return nb * T::kBlockN;
}

// What a modified kernel's scores need (set once per CTA by ModRows::of; plain kernels have none): the lane's rows
// and columns as apply_mask numbers them, and each switch's constants.
struct ModRows {
  int row_g, col_t;       // the lane's first row (row_g + 16 mt + 8 h) and first key offset in a block (+ 8 nt + e)
  int warp_row0;          // the warp's first row: a block needs masking iff some row of the warp needs it
  int seq_k, causal_offset;
  WindowBand band{0, 0};  // WINDOW: row i sees keys i + lo .. i + hi
  float cap_scale = 0.f;  // SOFTCAP: scale / c, the raw score's factor inside tanh
  float alibi_slope = 0.f;  // ALIBI: -slope alibi_unit, the bias per key of distance in S's units
  template <class T, class P>
  __device__ static ModRows of(const P& p, int warp_row0, int g, int tig, int seq_q, int seq_k, int batch, int head) {
    ModRows r{warp_row0 + g, 2 * tig, warp_row0, seq_k, seq_k - seq_q};  // warp_row0: a query index
    if constexpr (ModsOf<T>::window) {
      r.band = window_band(p.mods.window_left, p.mods.window_right, T::kCausal, seq_q, seq_k);
    }
    if constexpr (ModsOf<T>::softcap) r.cap_scale = p.mods.softcap_scale;
    if constexpr (ModsOf<T>::alibi)  // this (batch or sequence, query head)'s slope, in S's units
      r.alibi_slope = -p.mods.alibi_slopes[batch * p.mods.alibi_batch_stride + head] * p.mods.alibi_unit;
    return r;
  }
};

// ALiBi's bias on every element of the block at key n0: S += alibi_slope |i + seq_k - seq_q - j| (alibi_slope
// negative, in S's units). The distance in float from one conversion per block: d0, the lane's first row's
// distance to its first key, then constants (16 mt + 8 h rows down, 8 nt + e keys right); exact, every distance
// being below 2^22. An FADD and an FFMA (|x| is an operand modifier) per element.
template <class T>
__device__ __forceinline__ void add_alibi(float (&s)[T::kMTiles][T::kSTiles][4], const ModRows& r, int n0) {
  const float d0 = static_cast<float>(r.row_g + r.causal_offset - n0 - r.col_t);
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dist = d0 + static_cast<float>(16 * mt + 8 * (e >> 1) - 8 * nt - (e & 1));
        s[mt][nt][e] = fmaf(r.alibi_slope, fabsf(dist), s[mt][nt][e]);
      }
}

// Masking with a window: -inf at keys past seq_k and keys outside [i + lo, i + hi]; only blocks that straddle the
// end of the keys or an edge of the band for some row of the warp have any (fa2_mma_window_masks: the blocks wholly
// outside were skipped by kv_span, and a block wholly inside for all the warp's rows needs nothing).
template <class T>
__device__ __forceinline__ void mask_window(float (&s)[T::kMTiles][T::kSTiles][4], const ModRows& r, int n0) {
  if (!fa2_mma_window_masks(r.band, r.warp_row0, T::kRowsPerWarp, n0, T::kBlockN, r.seq_k)) return;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r.row_g + 16 * mt + 8 * (e >> 1);
        const int j = n0 + r.col_t + 8 * nt + (e & 1);
        if (j >= r.seq_k || j < i + r.band.lo || j > i + r.band.hi) s[mt][nt][e] = neg_inf();
      }
}

// A modified kernel's scores of the block at key n0: SOFTCAP first (S becomes tanh(S scale / c); its exp2-domain
// factor c log2(e) is then the kernel's scale_log2), then ALIBI's bias (every block), then the mask: WINDOW's
// band (mask_window), else the plain kernel's (keys past seq_k, causal), on the blocks that straddle them.
template <class T>
__device__ __forceinline__ void modify_scores(float (&s)[T::kMTiles][T::kSTiles][4], const ModRows& r, int n0) {
  if constexpr (ModsOf<T>::softcap) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = tanh_approx(s[mt][nt][e] * r.cap_scale);
  }
  if constexpr (ModsOf<T>::alibi) add_alibi<T>(s, r, n0);
  if constexpr (ModsOf<T>::window) {
    mask_window<T>(s, r, n0);
  } else if (n0 + T::kBlockN > r.seq_k || (T::kCausal && n0 + T::kBlockN - 1 > r.warp_row0 + r.causal_offset)) {
    apply_mask<T>(s, r.row_g, n0 + r.col_t, r.seq_k, r.causal_offset);
  }
}

// Online softmax over one K/V block for the lane's rows (mt, half h: row g + 8h):
// m = running max of raw scores, P = exp2(S*scale_log2 - m*scale_log2) in place,
// l = l*alpha + (this lane's partial row sum), O *= alpha with alpha = exp2((m_old - m)*scale_log2).
// A row with no visible key yet keeps m = -inf and uses base 0: P = 0, alpha = 0, no NaN.
template <class T>
__device__ __forceinline__ void online_softmax(float (&s)[T::kMTiles][T::kSTiles][4], float (&m)[T::kMTiles][2],
                                               float (&l)[T::kMTiles][2], float (&o)[T::kMTiles][T::kOTiles][4],
                                               float scale_log2) {
  float alpha[T::kMTiles][2];
  bool rescale = false;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(s[mt][0][2 * h], s[mt][0][2 * h + 1]);
#pragma unroll
      for (int nt = 1; nt < T::kSTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[mt][h], mx);
      const float base = (m_new == neg_inf()) ? 0.f : m_new * scale_log2;
      alpha[mt][h] = fast_exp2(fmaf(m[mt][h], scale_log2, -base));
      rescale |= m_new != m[mt][h];
      m[mt][h] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(s[mt][nt][2 * h + e], scale_log2, -base));
          s[mt][nt][2 * h + e] = pv;
          rs += pv;
        }
      l[mt][h] = fmaf(l[mt][h], alpha[mt][h], rs);
    }
  // Once the running maxima settle, most blocks change no row's max in the warp: skip O *= 1.
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < T::kOTiles; ++dt) {
        o[mt][dt][0] *= alpha[mt][0];
        o[mt][dt][1] *= alpha[mt][0];
        o[mt][dt][2] *= alpha[mt][1];
        o[mt][dt][3] *= alpha[mt][1];
      }
  }
}

// O += P V. P's k16 slice j (keys 16j..16j+15) as an A fragment is the packed accumulators of
// S n8 tiles 2j and 2j+1: {row g: tile 2j, row g+8: tile 2j, row g: tile 2j+1, row g+8: tile 2j+1}.
template <class T>
__device__ __forceinline__ void gemm_pv(float (&o)[T::kMTiles][T::kOTiles][4],
                                        const float (&s)[T::kMTiles][T::kSTiles][4], unsigned v_base) {
  using A = SmemLayout<T::kHeadDim, T::kSwizzled>;
#pragma unroll
  for (int kk = 0; kk < T::kPvSlices; ++kk) {
    unsigned pa[T::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      pa[mt][0] = pack_half2<T::kDtype>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][1] = pack_half2<T::kDtype>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][2] = pack_half2<T::kDtype>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][3] = pack_half2<T::kDtype>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < T::kOTiles / 2; ++dp) {
      unsigned b[4];  // b[0], b[1]: d tile 2dp; b[2], b[3]: d tile 2dp+1
      ldmatrix_x4_trans(b, A::at(v_base, 16 * kk, dp));
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
        mma_16816<T::kDtype>(o[mt][2 * dp], pa[mt], b[0], b[1]);
        mma_16816<T::kDtype>(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
      }
    }
  }
}

}  // namespace fa2_mma_detail

// The kernel's argument: the dense or packed params, with the modifications' values after them where the traits
// have any (ModParams). One name for it, as fa3_wgmma's Fa3FwdArg.
template <class Traits, bool VARLEN>
struct Fa2FwdArg {
  using type = typename ModParamsOf<ModsOf<Traits>::any, typename ParamsOf<VARLEN, AttnFwdParams>::type>::type;
};

// Traits: Fa2MmaTraits, or AttnModTraits<Fa2MmaTraits, WINDOW, SOFTCAP, ALIBI> (then the argument is ModParams).
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kThreads, 1) fa2_mma_fwd(const typename Fa2FwdArg<Traits, VARLEN>::type p) {
  using T = Traits;
  namespace det = fa2_mma_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BM = T::kBlockM;
  constexpr int BN = T::kBlockN;
  constexpr int NT = T::kThreads;
  constexpr int MT = T::kMTiles;
  constexpr int CPR = T::kChunksPerRow;
  constexpr int STAGES = T::kStages;
  constexpr bool CAUSAL = T::kCausal;
  check_dynamic_smem(T::kSmemBytes);

  // Its own name: a translation unit may include several families' kernels.
  extern __shared__ __align__(128) unsigned char fa2_mma_smem[];
  const unsigned q_tile = smem_u32(fa2_mma_smem);  // Qs[BM] rows, later O staging
  if (T::kSwizzled && (q_tile & 127u)) __trap();   // SmemLayout's XOR addressing: 128-byte tiles
  const unsigned kv_base = q_tile + T::kQBytes;    // STAGES x { Ks[BN] rows, Vs[BN] rows }
  auto k_tile = [&](int stage) { return kv_base + static_cast<unsigned>(stage * 2 * T::kTileBytes); };
  auto v_tile = [&](int stage) { return kv_base + static_cast<unsigned>(stage * 2 * T::kTileBytes + T::kTileBytes); };

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp_row0 = (tid >> 5) * T::kRowsPerWarp;  // first block row of this warp
  const int g = lane >> 2;                              // MMA fragment row group
  const int tig = lane & 3;                             // thread in group

  // Packed: this sequence's lengths and offsets (VarlenSeq); dense: the problem's.
  const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, blockIdx.z);
  const int seq_q = VARLEN ? vs.seq_q : p.seq_q;
  const int seq_k = VARLEN ? vs.seq_k : p.seq_k;
  // Rows of Q and O (K and V) are D elements apart, or a token's H*D (Hk*D) when packed.
  const int kv_heads = p.heads / query_group(p);
  const int q_stride = VARLEN ? p.heads * D : D;
  const int k_stride = VARLEN ? kv_heads * D : D;
  // Causal: the heaviest query blocks (largest i, most visible keys) launch first (packed: within
  // the sequence; blocks past its end exit).
  const int qblock = !CAUSAL ? static_cast<int>(blockIdx.x)
                     : VARLEN ? ceil_div(seq_q, BM) - 1 - static_cast<int>(blockIdx.x)
                              : static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int m0 = qblock * BM;
  if (m0 >= seq_q || (VARLEN && m0 < 0)) return;  // whole block: safe before any barrier
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  // Grouped-query attention: this query head's kv head.
  const long long bh_kv = static_cast<long long>(blockIdx.z) * (p.heads / query_group(p)) + blockIdx.y / query_group(p);
  const long long q_off = VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) : bh * seq_q * D;
  const long long k_off = VARLEN ? vs.k_offset(kv_heads, blockIdx.y / query_group(p), D) : bh_kv * seq_k * D;
  const unsigned short* q = static_cast<const unsigned short*>(p.q) + q_off;
  const unsigned short* k = static_cast<const unsigned short*>(p.k) + k_off;
  const unsigned short* v = static_cast<const unsigned short*>(p.v) + k_off;
  // SOFTCAP: the capped score's factor (S holds tanh(S scale / c) by then), for the softmax and the LSE alike.
  float scale_log2 = p.scale_log2;
  if constexpr (ModsOf<T>::softcap) scale_log2 = p.mods.softcap_log2;

  // Key j is visible to query i iff j <= i + causal_offset (bottom-right aligned).
  const int causal_offset = seq_k - seq_q;
  int kv_end = seq_k;  // keys [0, kv_end) can be visible to some row of this block
  if (CAUSAL) kv_end = imin(seq_k, imin(m0 + BM, seq_q) + causal_offset);
  int num_kv_blocks = kv_end > 0 ? (kv_end + BN - 1) / BN : 0;
  // Modified: the blocks kv_span gives (WINDOW: from key0 on) and the scores' constants (ModRows).
  int key0 = 0;
  det::ModRows mod{};
  if constexpr (ModsOf<T>::any) {
    const BlockSpan span = det::kv_span<T>(p, m0, seq_q, seq_k);
    num_kv_blocks = span.count;
    key0 = span.first * BN;
    mod = det::ModRows::of<T>(p, m0 + warp_row0, g, tig, seq_q, seq_k, blockIdx.z, blockIdx.y);
  }

  // Lane addressing of the ldmatrix.x4: A operands (Q) and trans B (V) read row lane%16 of a
  // 16-row slab, chunk 2*slice + lane/16; non-trans B (K) reads row lane%8 + 8*(lane/16),
  // chunk 2*slice + (lane/8)%2.
  using Addr = det::SmemLayout<D>;
  const unsigned a_lane = Addr::lane_base(lane & 15, lane >> 4);
  const unsigned k_lane = Addr::lane_base((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const unsigned q_base = q_tile + static_cast<unsigned>(warp_row0 * T::kRowBytes) + a_lane;
  float o[MT][T::kOTiles][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mt][h] = neg_inf();
      l[mt][h] = 0.f;
    }
#pragma unroll
    for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
  }
  unsigned qf[T::kQInRegs ? MT : 1][T::kQInRegs ? T::kQkSlices : 1][4];

  // Q (once) into registers, after Q's commit group has landed and a barrier (lanes read rows
  // that other lanes copied).
  auto load_q_regs = [&]() {
    if constexpr (T::kQInRegs) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ks = 0; ks < T::kQkSlices; ++ks) ldmatrix_x4(qf[mt][ks], Addr::at(q_base, 16 * mt, ks));
    }
  };
  // S for the block at key n0, masked where the block straddles the diagonal or seq_k.
  // Modified: modify_scores instead (the switches, then the mask where some row of the warp needs it).
  auto scores = [&](float (&s)[MT][T::kSTiles][4], unsigned kt, int n0) {
    det::gemm_qk<T>(s, qf, q_base, kt + k_lane);
    if constexpr (ModsOf<T>::any) {
      det::modify_scores<T>(s, mod, n0);
    } else {
      const bool needs_mask = (n0 + BN > seq_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset);
      if (needs_mask) det::apply_mask<T>(s, m0 + warp_row0 + g, n0 + 2 * tig, seq_k, causal_offset);
    }
  };

  det::load_tile_async<BM, D, NT>(q_tile, q, q_stride, m0, seq_q, tid);
  cp_async_commit();
  if constexpr (STAGES == 1) {
    // FlashAttention-2's schedule on one K and one V buffer: V(n) lands during S(n),
    // K(n+1) lands during softmax and O += P V(n).
    if (num_kv_blocks > 0) det::load_tile_async<BN, D, NT>(k_tile(0), k, k_stride, det::block_key<T>(key0, 0), seq_k, tid);
    cp_async_commit();
    if constexpr (T::kQInRegs) {
      cp_async_wait<1>();  // Q; K(0) may still be in flight
      __syncthreads();
      load_q_regs();
    }
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      int n0 = nb * BN;
      if constexpr (ModsOf<T>::window) n0 = det::block_key<T>(key0, nb);  // (the plain loop's code as it was)
      cp_async_wait<0>();  // K(n) (and Q)
      __syncthreads();     // visible to all; everyone done reading V(n-1)
      det::load_tile_async<BN, D, NT>(v_tile(0), v, k_stride, n0, seq_k, tid);
      cp_async_commit();
      float s[MT][T::kSTiles][4];
      scores(s, k_tile(0), n0);
      cp_async_wait<0>();  // V(n)
      __syncthreads();     // visible to all; everyone done reading K(n)
      if (nb + 1 < num_kv_blocks) det::load_tile_async<BN, D, NT>(k_tile(0), k, k_stride, n0 + BN, seq_k, tid);
      cp_async_commit();
      det::online_softmax<T>(s, m, l, o, scale_log2);
      det::gemm_pv<T>(o, s, v_tile(0) + a_lane);
    }
  } else {
    // Ring of STAGES K/V slots, STAGES-1 blocks in flight ahead of the one computed; one
    // commit group per block (empty past the end) so wait_group<STAGES-2> means "block nb".
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < num_kv_blocks) {
        det::load_tile_async<BN, D, NT>(k_tile(st), k, k_stride, det::block_key<T>(key0, st), seq_k, tid);
        det::load_tile_async<BN, D, NT>(v_tile(st), v, k_stride, det::block_key<T>(key0, st), seq_k, tid);
      }
      cp_async_commit();
    }
    if constexpr (T::kQInRegs) {
      cp_async_wait<STAGES - 1>();  // Q; the prologue's blocks may still be in flight
      __syncthreads();
      load_q_regs();
    }
    int stage = 0;
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      int n0 = nb * BN;
      if constexpr (ModsOf<T>::window) n0 = det::block_key<T>(key0, nb);  // (the plain loop's code as it was)
      cp_async_wait<STAGES - 2>();  // block nb (and Q)
      __syncthreads();              // visible to all; everyone done with block nb-1's slot
      const int ahead = nb + STAGES - 1;
      const int ahead_stage = stage == 0 ? STAGES - 1 : stage - 1;  // the slot of block nb-1
      if (ahead < num_kv_blocks) {
        det::load_tile_async<BN, D, NT>(k_tile(ahead_stage), k, k_stride, det::block_key<T>(key0, ahead), seq_k, tid);
        det::load_tile_async<BN, D, NT>(v_tile(ahead_stage), v, k_stride, det::block_key<T>(key0, ahead), seq_k, tid);
      }
      cp_async_commit();
      float s[MT][T::kSTiles][4];
      scores(s, k_tile(stage), n0);
      det::online_softmax<T>(s, m, l, o, scale_log2);
      det::gemm_pv<T>(o, s, v_tile(stage) + a_lane);
      stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
  }

  // Epilogue: full row sums over the quad, O /= l, 16-bit O staged in this warp's own rows
  // of Qs (only this warp ever read them), then 16-byte coalesced stores; lse per row.
  // Fully masked rows (no visible key): O = 0, lse = +inf.
  cp_async_wait<0>();
  __syncthreads();  // no cp.async (Q when there was no K/V block) still writing Qs
  // Output pointers formed here, not kept live through the loop.
  unsigned short* o_out = static_cast<unsigned short*>(p.o) + (VARLEN ? vs.q_offset(p.heads, blockIdx.y, D) : bh * seq_q * D);
  float* lse_out = p.lse + (VARLEN ? vs.lse_offset(blockIdx.y) : bh * seq_q);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lt = l[mt][h];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int r = warp_row0 + 16 * mt + g + 8 * h;  // block row
#pragma unroll
      for (int dt = 0; dt < T::kOTiles; ++dt) {
        const unsigned packed = pack_half2<T::kDtype>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
        st_shared_u32(q_tile + Addr::offset(r, dt) + 4 * tig, packed);
      }
      const int i = m0 + r;
      if (tig == 0 && i < seq_q) lse_out[i] = lt > 0.f ? fmaf(m[mt][h], scale_log2, fast_log2(lt)) * kLn2 : pos_inf();
    }
  __syncwarp();
  constexpr int kWarpChunks = T::kRowsPerWarp * CPR;
#pragma unroll
  for (int it = 0; it < ceil_div(kWarpChunks, 32); ++it) {
    const int idx = lane + 32 * it;
    if (kWarpChunks % 32 == 0 || idx < kWarpChunks) {
      const int r = warp_row0 + idx / CPR;
      const int c = idx % CPR;
      if (m0 + r < seq_q) {
        const uint4 val = ld_shared_v4(q_tile + Addr::offset(r, c));
        *reinterpret_cast<uint4*>(o_out + static_cast<long long>(m0 + r) * q_stride + 8 * c) = val;
      }
    }
  }
}

}  // namespace flashtune
