// Split-KV forward for decoding (FlashDecoding): Sq of 1 to 16 query rows per head against a long K/V
// cache, fp16 or bf16 in and out, fp32 accumulation, fp32 natural-log LSE; grouped-query attention native.
//   decode_splitkv_partial<DecodeSplitkvTraits<D, SPLITS, BLOCK_N, WARPS, STAGES, DTYPE, CAUSAL>[, PAGED]>
//   decode_splitkv_combine<same traits[, PAGED]>   (launched only when SPLITS > 1)
// PAGED true: the paged K/V cache form (PagedParams), below; on PagedNhdTraits<traits>, its token-major pages.
//
// Decoding is memory bound: each K/V element is used by only g*Sq query rows (g = query heads per kv head),
// so the kernels exist to stream K and V once, at HBM bandwidth, from enough CTAs to fill the GPU.
//
// Partial kernel. Grid x = SPLITS * row tiles (split major), y = kv heads, z = batch; 32*WARPS threads;
// kSmemBytes dynamic shared memory (checked at entry). A CTA owns
//   rows: 16 of the kv head's group rows. The group's g query heads x Sq rows are one contiguous
//         (g*Sq, d) matrix of Q (heads kv_head*g .. kv_head*g+g-1 are adjacent), so a CTA loads its
//         rows of every query head that reads this kv head at once and K/V are read once for all of
//         them: GQA costs no extra K/V traffic. A group of more than 16 rows takes several row tiles,
//         adjacent in x, so their CTAs run together and share K/V through L2.
//   keys: split s's range of whole BLOCK_N blocks (decode_splitkv_key_begin: the blocks shared out
//         evenly), cut to Sk; cut to what the tile's rows can see when causal (bottom-right: query i sees
//         key j iff j <= i + Sk - Sq). A split that owns no block, or one no row of the tile sees, runs no block and
//         writes empty results (O = 0, LSE = -inf).
// K/V arrive by 16-byte cp.async into shared memory, in fa2_mma's tile layout and schedules (STAGES 1: one
// K and one V buffer, V(n) lands during S(n) and K(n+1) during softmax and PV(n); STAGES 2-4: a ring, blocks
// n+1 .. n+STAGES-1 in flight during block n). cp.async rather than loads into registers: the data have to reach every
// warp in the MMA fragment layouts anyway (ldmatrix from shared memory), copies in flight hold no
// registers, so a CTA keeps BLOCK_N*d*4 bytes in flight (STAGES 2) at no register cost, and several CTAs
// fit per SM. The loader (load_rows) forms one 64-bit address per thread and tile; every chunk's offset
// is an immediate of its cp.async (at d = 256 a thread's rows share one swizzle key for that), and only a
// ragged last tile is predicated, its missing rows zero-filled with shared-memory stores. Registers
// decided this (docs/kernels.md): fa2_mma's loader (a 64-bit pointer select per 16-byte chunk) kept 30-60
// registers of addresses live through this loop, and offsets computed in C++ became, by NVVM's loop
// strength reduction, 32 loop-invariant 64-bit pointers a tile; both spilled.
// Q (16 rows) is loaded once into shared memory and its fragments re-read by ldmatrix every block: its
// d/4 registers would cost a CTA per SM at d = 128, and decoding leaves shared-memory bandwidth idle.
// Each warp takes KW = BLOCK_N/WARPS keys of every block for all 16 rows and runs exactly a fa2_mma
// warp's step on them (fa2_mma_detail::gemm_qk, online_softmax in the exp2 domain, gemm_pv: S = Q K^T
// and O += P V on mma.sync m16n8k16; the rows are padded to 16, which costs tensor work that is free
// here and no bytes), with a per-row key limit as the mask. After the last block the warps' (m, l, O)
// are merged through shared memory (the K/V buffers, dead by then): M = max m_w,
// L = sum_w l_w 2^((m_w - M) scale_log2), O = sum_w 2^((m_w - M) scale_log2) O_w / L, LSE = (M scale_log2
// + log2 L) ln2, summed in warp order (deterministic). SPLITS > 1: O (fp32) and LSE into the workspace,
// O as [SPLITS][B*H*Sq][d], LSE as [B*H*Sq][SPLITS], every element written (empty rows: O = 0,
// LSE = -inf). SPLITS = 1: O (16-bit) and LSE straight into p.o and p.lse, with the harness's rule for a
// row that sees no key (O = 0, LSE = +inf); no workspace and no second launch.
//
// Paged form (decode_splitkv_partial<Traits, true>, on PagedParams: K and V in pools of pages through a block
// table, attention_params.h). Sequence b holds cache_seqlens[b] keys: the CTA's splits share out that
// sequence's own blocks, its causal mask is aligned to its own length, and a block's rows are found through
// the table: BLOCK_N divides the page size (checked at entry, and by the family before a launch), so a block
// lies inside one page, where its rows are d elements apart as a dense head's, and the loader above takes it
// unchanged from the page's base (one table entry a block, looked up a block ahead so that its load waits
// behind the barriers and the block's math, not in front of the copies). The dense form's code is unchanged.
// Token-major pages (decode_splitkv_partial<PagedNhdTraits<Traits>, true>: FlashAttention's and vLLM's (num_pages,
// page_size, heads_k, d) pools, read in place): the same blocks, pages and table lookups; a block's rows are
// heads_k*d elements apart, so the loader (load_rows_strided) gives each of a thread's rows its own base, one
// 64-bit add from the previous row's (kept opaque to the compiler, so that no per-row offset stays live through the
// loop), each row's chunks still at immediate offsets. The same bytes and the same 16-byte copies as head-major
// pages; each row is 2*d contiguous bytes (128 to 512: whole 32-byte sectors and 128-byte lines) rather than the
// tile being one contiguous run. The head-major kernels' code is unchanged (the wrapper is a different type).
//
// Combine kernel. Grid x = ceil(H*Sq / 4), z = batch; 4 warps, a warp per (batch, query head, query
// row): LSE = log(sum_s exp(LSE_s)), O = sum_s exp(LSE_s - LSE) O_s over the splits with LSE_s > -inf
// (their O_s is not read), in split order; every split empty: O = 0, LSE = +inf. Lane l owns columns
// [l*d/32, (l+1)*d/32) (8-, 16- or 32-byte loads per split, the row's d floats coalesced).
#pragma once
#include "attention_params.h"
#include "decode_splitkv_traits.h"
#include "device_common.cuh"
#include "fa2_mma.cuh"

namespace flashtune {

namespace decode_splitkv_detail {

// -inf where key j is at or past the lane's row limit: fragment element e of n8 tile nt is row
// g + 8*(e >> 1), key col0 + 8*nt + (e & 1); lim[h] = first key row g + 8h may not see.
template <class T>
__device__ __forceinline__ void mask_keys(float (&s)[1][T::kSTiles][4], int col0, const int (&lim)[2]) {
#pragma unroll
  for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col0 + 8 * nt + (e & 1) >= lim[e >> 1]) s[0][nt][e] = neg_inf();
}

// Sum over the warps' fp32 O tiles in shared memory (stride = one warp's tile), in warp order.
template <int WARPS>
__device__ __forceinline__ float4 sum_over_warps(const float* first, int stride) {
  float4 acc = lds128(first);
#pragma unroll
  for (int w = 1; w < WARPS; ++w) {
    const float4 x = lds128(first + w * stride);
    acc.x += x.x;
    acc.y += x.y;
    acc.z += x.z;
    acc.w += x.w;
  }
  return acc;
}

// 16-byte cp.async from gmem + GOFF bytes to smem + SOFF bytes, both offsets immediates of the instruction
// ([reg+imm] addressing): the compiler sees one base register per operand, so it cannot turn a tile's
// offsets into as many loop-invariant 64-bit pointers (it did: 32 per tile, 224 bytes of spills at d = 256).
template <int SOFF, int GOFF>
__device__ __forceinline__ void cp_async_16_at(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(smem), "l"(gmem), "n"(SOFF), "n"(GOFF)
               : "memory");
}
template <int SOFF>
__device__ __forceinline__ void st_shared_zero16_at(unsigned smem) {
  asm volatile("st.shared.v4.u32 [%0+%1], {%2, %2, %2, %2};\n" ::"r"(smem), "n"(SOFF), "r"(0u) : "memory");
}

__device__ __forceinline__ void st_shared_f32x2(float* dst, float x, float y) {
  float2 v;
  v.x = x;
  v.y = y;
  *reinterpret_cast<float2*>(dst) = v;
}

// COLS consecutive floats (COLS = 2, 4 or 8; 8- or 16-byte aligned) from global memory.
template <int COLS>
__device__ __forceinline__ void load_cols(float (&x)[COLS], const float* src) {
  if constexpr (COLS % 4 == 0) {
#pragma unroll
    for (int c = 0; c < COLS; c += 4) {
      const float4 v = *reinterpret_cast<const float4*>(src + c);
      x[c] = v.x;
      x[c + 1] = v.y;
      x[c + 2] = v.z;
      x[c + 3] = v.w;
    }
  } else {
    static_assert(COLS == 2, "2, 4 or 8 columns per lane");
    const float2 v = *reinterpret_cast<const float2*>(src);
    x[0] = v.x;
    x[1] = v.y;
  }
}

// COLS floats as 16-bit values to global memory, one 4-, 8- or 16-byte store.
template <int DTYPE, int COLS>
__device__ __forceinline__ void store_cols(unsigned short* dst, const float (&x)[COLS]) {
  unsigned w[COLS / 2];
#pragma unroll
  for (int c = 0; c < COLS / 2; ++c) w[c] = pack_half2<DTYPE>(x[2 * c], x[2 * c + 1]);
  if constexpr (COLS == 8) {
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    *reinterpret_cast<uint4*>(dst) = v;
  } else if constexpr (COLS == 4) {
    uint2 v;
    v.x = w[0];
    v.y = w[1];
    *reinterpret_cast<uint2*>(dst) = v;
  } else {
    static_assert(COLS == 2, "2, 4 or 8 columns per lane");
    *reinterpret_cast<unsigned*>(dst) = w[0];
  }
}

// How load_rows spreads a tile of ROWS rows of D 16-bit elements (CPR 16-byte chunks a row) over NT threads:
//   - rows of chunks in thread order (thread t: chunk t % CPR of rows t / CPR + i*NT/CPR) when a thread's
//     rows keep their swizzle key (padded layout, or NT/CPR a multiple of 8);
//   - otherwise (swizzled d = 256 with 2 or 4 warps) thread t takes rows t % 8 + 8i and chunk columns
//     t / 8 + (NT/8) j: its rows share one key, so the XOR folds into its base (per-row keys took 16
//     registers and made d = 256 spill). A warp then reads 64 or 128 contiguous bytes of 8 rows: whole
//     32-byte sectors.
template <int ROWS, int D, int NT>
struct RowsMapping {
  using L = fa2_mma_detail::SmemLayout<D, decode_splitkv_swizzled(D)>;
  static constexpr int kRows = ROWS;
  static constexpr int kHeadDim = D;
  static constexpr int kCpr = D / 8;
  static constexpr bool kRowMajor = NT % kCpr == 0 && (!L::kSwizzled || (NT / kCpr) % 8 == 0);
  static_assert(kRowMajor || (L::kSwizzled && ROWS % 8 == 0 && (NT / 8) % 8 == 0 && kCpr % (NT / 8) == 0),
                "column-group mapping: 8-row groups, chunk groups that leave the key's 3 bits alone");
  static constexpr int kRowStep = kRowMajor ? NT / kCpr : 8;  // rows between a thread's rows
  static constexpr int kRowIters = (ROWS + kRowStep - 1) / kRowStep;
  static constexpr int kColStep = kRowMajor ? kCpr : NT / 8;  // chunks between a thread's chunks of a row
  static constexpr int kColIters = kCpr / kColStep;          // 1 for the row-major mapping
  __device__ __forceinline__ static int row0(int tid) { return kRowMajor ? tid / kCpr : tid % 8; }
  __device__ __forceinline__ static int col0(int tid) { return kRowMajor ? tid % kCpr : tid / 8; }
};

// Chunk c0 + JT*kColStep of row r0 + IT*kRowStep, for every (IT, JT) from the given ones on: copied when the
// row exists (full tile, or IT*kRowStep < valid), else zero-filled. The row's key is r0's, and kColStep is a
// multiple of 8 chunks in the column-group mapping, so the XOR leaves JT*kColStep alone: both offsets are
// compile-time constants (a template recursion: NVRTC takes no generic lambdas in device code).
template <class M, int IT, int JT>
__device__ __forceinline__ void load_chunks(unsigned s0, const unsigned short* g, int r0, bool full, int valid) {
  if constexpr (IT < M::kRowIters) {
    if constexpr (JT < M::kColIters) {
      if (M::kRows % M::kRowStep == 0 || r0 + IT * M::kRowStep < M::kRows) {
        constexpr int kSmemOff = IT * M::kRowStep * M::L::RB + 16 * JT * M::kColStep;
        constexpr int kGmemOff = 2 * (IT * M::kRowStep * M::kHeadDim + 8 * JT * M::kColStep);
        if (full || IT * M::kRowStep < valid) cp_async_16_at<kSmemOff, kGmemOff>(s0, g);
        else st_shared_zero16_at<kSmemOff>(s0);
      }
      load_chunks<M, IT, JT + 1>(s0, g, r0, full, valid);
    } else {
      load_chunks<M, IT + 1, 0>(s0, g, r0, full, valid);
    }
  }
}

// Rows [n0, n0 + ROWS) of a (seq, D) 16-bit matrix into a shared-memory tile (fa2_mma's SmemLayout), rows at
// or past `end` zero-filled by shared-memory stores (no global access is issued for them). One 64-bit
// base per thread and tile; every chunk's offset is an immediate of its instruction, so that no per-chunk
// address can stay live through the main loop.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short* src, int n0, int end, int tid) {
  using M = RowsMapping<ROWS, D, NT>;
  const int r0 = M::row0(tid);
  const int c0 = M::col0(tid);
  const unsigned short* g = src + (static_cast<long long>(n0) + r0) * D + 8 * c0;
  load_chunks<M, 0, 0>(dst + M::L::offset(r0, c0), g, r0, n0 + ROWS <= end, end - n0 - r0);
}

// p + bytes as one 64-bit add the compiler cannot see into. Written in C++, the bases of a thread's rows in a
// strided tile are base + IT * step: NVVM's loop strength reduction would keep every IT * step (a 64-bit offset per
// row, 16-32 a tile) live through the main loop, as it kept per-chunk offsets (the loader's note above).
__device__ __forceinline__ const unsigned short* advance_bytes(const unsigned short* p, long long bytes) {
  const unsigned short* out;
  asm("add.s64 %0, %1, %2;\n" : "=l"(out) : "l"(p), "l"(bytes));
  return out;
}

// load_chunks over rows `row_step` bytes apart in global memory (a token-major page: heads_k*D elements): each
// of a thread's rows from its own base, the previous row's advanced by row_step; its chunks' offsets within the
// row immediates as above, the shared-memory side unchanged.
template <class M, int IT, int JT>
__device__ __forceinline__ void load_chunks_strided(unsigned s0, const unsigned short* g, long long row_step, int r0,
                                                    bool full, int valid) {
  if constexpr (IT < M::kRowIters) {
    if constexpr (JT < M::kColIters) {
      if (M::kRows % M::kRowStep == 0 || r0 + IT * M::kRowStep < M::kRows) {
        constexpr int kSmemOff = IT * M::kRowStep * M::L::RB + 16 * JT * M::kColStep;
        constexpr int kGmemOff = 16 * JT * M::kColStep;
        if (full || IT * M::kRowStep < valid) cp_async_16_at<kSmemOff, kGmemOff>(s0, g);
        else st_shared_zero16_at<kSmemOff>(s0);
      }
      load_chunks_strided<M, IT, JT + 1>(s0, g, row_step, r0, full, valid);
    } else if constexpr (IT + 1 < M::kRowIters) {
      load_chunks_strided<M, IT + 1, 0>(s0, advance_bytes(g, row_step), row_step, r0, full, valid);
    }
  }
}

// Rows [0, ROWS) of a (rows, D) 16-bit matrix whose rows are `stride` elements apart (stride >= D) into a tile, as
// load_rows: rows at or past `end` zero-filled. One 64-bit add per row of a thread's rows besides load_rows' work.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows_strided(unsigned dst, const unsigned short* src, long long stride, int end,
                                                  int tid) {
  using M = RowsMapping<ROWS, D, NT>;
  const int r0 = M::row0(tid);
  const int c0 = M::col0(tid);
  const unsigned short* g = src + static_cast<long long>(r0) * stride + 8 * c0;
  load_chunks_strided<M, 0, 0>(dst + M::L::offset(r0, c0), g, 2 * M::kRowStep * stride, r0, ROWS <= end, end - r0);
}

// Paged form: where a block of keys lives, its physical page and its first key's row in that page.
struct PageRef {
  int page = 0, row = 0;
};

// The cache length of sequence `batch`: the paged form's own, the dense form's Sk.
template <bool PAGED, class Params>
__device__ __forceinline__ int cache_len(const Params& p, int batch) {
  if constexpr (PAGED) return p.cache_seqlens[batch];
  else return p.seq_k;
}

}  // namespace decode_splitkv_detail

// __launch_bounds__(threads, 1), as fa2_mma: with the thread count alone, ptxas aims at an occupancy of its own
// and capped some d = 64 variants at 96 registers with 8-16 bytes of spills (NVRTC 13.0, sm_90).
template <class Traits, bool PAGED = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_splitkv_partial(const typename PagedParamsOf<PAGED, AttnFwdParams>::type p) {
  using T = Traits;
  namespace fa2 = fa2_mma_detail;
  namespace det = decode_splitkv_detail;
  constexpr int D = T::kHeadDim;
  constexpr int BN = T::kBlockN;
  constexpr int KW = T::kKeysPerWarp;
  constexpr int NT = T::kThreads;
  constexpr int ROWS = T::kRows;
  constexpr int WARPS = T::kWarps;
  constexpr int STAGES = T::kStages;
  constexpr int SPLITS = T::kSplits;
  constexpr bool CAUSAL = T::kCausal;
  constexpr bool NHD = PagesOf<T>::nhd();  // token-major pages (PagedNhdTraits)
  static_assert(PAGED || !NHD, "the token-major layout is a layout of the paged form");
  check_dynamic_smem(T::kSmemBytes);
  if constexpr (PAGED)
    if (p.page_size <= 0 || p.page_size % BN != 0) __trap();  // a block would straddle two pages

  // Its own name: a translation unit may include several families' kernels.
  extern __shared__ __align__(128) unsigned char decode_splitkv_smem[];
  const unsigned q_tile = smem_u32(decode_splitkv_smem);  // Qs[16] rows
  if (T::kSwizzled && (q_tile & 127u)) __trap();           // SmemLayout's XOR addressing: 128-byte tiles
  const unsigned kv_base = q_tile + T::kQBytes;            // STAGES x { Ks[BN] rows, Vs[BN] rows }
  auto k_tile = [&](int stage) { return kv_base + static_cast<unsigned>(stage * 2 * T::kTileBytes); };
  auto v_tile = [&](int stage) { return kv_base + static_cast<unsigned>(stage * 2 * T::kTileBytes + T::kTileBytes); };
  float* obuf = reinterpret_cast<float*>(decode_splitkv_smem + T::kQBytes);  // after the loop: [WARPS][16][D+8]
  float* row_max = reinterpret_cast<float*>(decode_splitkv_smem + T::kStatsOffset);  // [WARPS][16]
  float* row_sum = row_max + WARPS * ROWS;                                             // [WARPS][16]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;    // MMA fragment row group: this lane's rows are g and g + 8
  const int tig = lane & 3;   // thread in group

  // Rows: tile (blockIdx.x % row_tiles) of the kv head's group rows; group row r is query head
  // kv_head*group + r / seq_q, query row r % seq_q.
  const int seq_q = p.seq_q;
  const int seq_k = det::cache_len<PAGED>(p, blockIdx.z);  // paged: this sequence's keys
  const int group = query_group(p);
  const int group_rows = group * seq_q;
  const int row_tiles = decode_splitkv_row_tiles(group_rows);
  const int split = static_cast<int>(blockIdx.x) / row_tiles;
  const int row0 = static_cast<int>(blockIdx.x) % row_tiles * ROWS;  // the tile's first group row
  const int rows_here = imin(ROWS, group_rows - row0);
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  // Flat (b, h, i) row of group row 0, i.e. of query head kv_head*group, row 0.
  const long long group_first = (static_cast<long long>(batch) * p.heads + static_cast<long long>(kv_head) * group) * seq_q;
  const long long bh_kv = static_cast<long long>(batch) * (p.heads / group) + kv_head;
  const unsigned short* q = static_cast<const unsigned short*>(p.q) + group_first * D;  // (group_rows, D)
  // Dense: this (batch, kv head)'s (Sk, D) matrices; paged: the pools, a block's page found by block_at.
  const unsigned short* k = static_cast<const unsigned short*>(p.k);
  const unsigned short* v = static_cast<const unsigned short*>(p.v);
  if constexpr (!PAGED) {
    k += bh_kv * seq_k * D;
    v += bh_kv * seq_k * D;
  }
  const float scale_log2 = p.scale_log2;

  // Keys: this split's range, cut (causal) to what some row of the tile can see.
  const int k_begin = decode_splitkv_key_begin(seq_k, SPLITS, BN, split);
  const int k_end = imin(seq_k, decode_splitkv_key_begin(seq_k, SPLITS, BN, split + 1));  // = k_begin: none
  const int causal_offset = seq_k - seq_q;         // key j is visible to query i iff j <= i + causal_offset
  int kv_end = k_end;    // keys [k_begin, kv_end) are visible to some row of the tile
  int full_end = k_end;  // keys [k_begin, full_end) are visible to every row of the tile: no mask there
  if (CAUSAL) {
    int i_lo = seq_q, i_hi = -1;  // the tile's query rows (not contiguous when it spans two heads)
    for (int r = 0; r < rows_here; ++r) {
      const int i = (row0 + r) % seq_q;
      i_lo = imin(i_lo, i);
      i_hi = imax(i_hi, i);
    }
    kv_end = imin(k_end, i_hi + causal_offset + 1);
    full_end = imin(k_end, i_lo + causal_offset + 1);
  }
  const int num_kv_blocks = kv_end > k_begin ? ceil_div(kv_end - k_begin, BN) : 0;
  // Per lane: the first key each of its two rows may not see (padding rows past the group get some
  // row's limit: their Q is zero, their results are never stored).
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = (row0 + g + 8 * h) % seq_q;
    lim[h] = CAUSAL ? imin(kv_end, i + causal_offset + 1) : kv_end;
  }

  // ldmatrix lane addressing as in fa2_mma: A (Q) and trans B (V) read row lane%16 of a 16-row slab,
  // chunk 2*slice + lane/16; non-trans B (K) row lane%8 + 8*(lane/16), chunk 2*slice + (lane/8)%2.
  // Warp w's keys are rows [w*KW, (w+1)*KW) of every K/V tile (KW a multiple of 16, so the swizzle key
  // of a row is unchanged and tile offsets stay 128-byte multiples).
  using Addr = fa2::SmemLayout<D, T::kSwizzled>;
  const unsigned a_lane = Addr::lane_base(lane & 15, lane >> 4);
  const unsigned k_lane = Addr::lane_base((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const unsigned q_base = q_tile + a_lane;
  const unsigned warp_keys = static_cast<unsigned>(warp * KW * T::kRowBytes);

  float o[1][T::kOTiles][4];
  float m[1][2], l[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[0][h] = neg_inf();
    l[0][h] = 0.f;
  }
#pragma unroll
  for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][dt][e] = 0.f;
  const unsigned qf[1][1][4] = {};  // unused: Q's fragments are read from Qs each block (kQInRegs false)
  // Paged: block n0's page (BLOCK_N divides the page size, so the block is inside it) from the block table.
  auto block_at = [&](int n0) {
    det::PageRef r;
    if constexpr (PAGED) {
      const int j = n0 / p.page_size;
      r.page = __ldg(p.block_table + static_cast<long long>(batch) * p.max_pages + j);
      r.row = n0 - j * p.page_size;
    }
    return r;
  };
  // Keys [n0, n0 + BN) into a tile; keys at or past kv_end are zero-filled, never read. Paged: from the rows of
  // its page (`at`, block_at(n0)), its kv head's (page_size, D) matrix there; token-major pages: its kv head's
  // rows of the page, heads_k*D elements apart.
  auto load_kv = [&](unsigned dst, const unsigned short* src, int n0, det::PageRef at) {
    if constexpr (NHD) {
      const int heads_k = p.heads / group;
      det::load_rows_strided<BN, D, NT>(dst, src + nhd_paged_key_offset(at.page, heads_k, p.page_size, kv_head, at.row, D),
                                        static_cast<long long>(heads_k) * D, kv_end - n0, tid);
    } else if constexpr (PAGED)
      det::load_rows<BN, D, NT>(dst, src + paged_key_offset(at.page, p.heads / group, p.page_size, kv_head, at.row, D), 0,
                                kv_end - n0, tid);
    else
      det::load_rows<BN, D, NT>(dst, src, n0, kv_end, tid);
  };
  // This warp's scores for the block at key n0, masked where the block holds keys some row may not see.
  auto scores = [&](float (&s)[1][T::kSTiles][4], unsigned kt, int n0) {
    fa2::gemm_qk<T>(s, qf, q_base, kt + warp_keys + k_lane);
    if (n0 + BN > full_end) det::mask_keys<T>(s, n0 + warp * KW + 2 * tig, lim);
  };

  det::load_rows<ROWS, D, NT>(q_tile, q, row0, group_rows, tid);  // rows past the group zero-filled
  cp_async_commit();
  if constexpr (STAGES == 1) {
    // One K and one V buffer (fa2_mma's STAGES 1 schedule): V(n) lands during S(n), K(n+1) during
    // softmax and O += P V(n). Paged: block n's page in `at`, block n+1's looked up before the waits.
    det::PageRef at, next;
    if (num_kv_blocks > 0) {
      if constexpr (PAGED) at = block_at(k_begin);
      load_kv(k_tile(0), k, k_begin, at);
    }
    cp_async_commit();
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      const int n0 = k_begin + nb * BN;
      if constexpr (PAGED)
        if (nb + 1 < num_kv_blocks) next = block_at(n0 + BN);
      cp_async_wait<0>();  // K(n) (and Q)
      __syncthreads();     // visible to all; everyone done reading V(n-1)
      load_kv(v_tile(0), v, n0, at);
      cp_async_commit();
      float s[1][T::kSTiles][4];
      scores(s, k_tile(0), n0);
      cp_async_wait<0>();  // V(n)
      __syncthreads();     // visible to all; everyone done reading K(n)
      if (nb + 1 < num_kv_blocks) load_kv(k_tile(0), k, n0 + BN, next);
      cp_async_commit();
      fa2::online_softmax<T>(s, m, l, o, scale_log2);
      fa2::gemm_pv<T>(o, s, v_tile(0) + warp_keys + a_lane);
      if constexpr (PAGED) at = next;
    }
  } else {
    // Ring of STAGES K/V slots, STAGES-1 blocks in flight ahead of the one computed; one commit group
    // per block (empty past the end), so wait_group<STAGES-2> means "block nb landed". Paged: the page of
    // the block issued next (`ahead_at`), looked up an iteration before it is issued.
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < num_kv_blocks) {
        const det::PageRef at = block_at(k_begin + st * BN);
        load_kv(k_tile(st), k, k_begin + st * BN, at);
        load_kv(v_tile(st), v, k_begin + st * BN, at);
      }
      cp_async_commit();
    }
    det::PageRef ahead_at;
    if constexpr (PAGED)
      if (STAGES - 1 < num_kv_blocks) ahead_at = block_at(k_begin + (STAGES - 1) * BN);
    int stage = 0;
    for (int nb = 0; nb < num_kv_blocks; ++nb) {
      const int n0 = k_begin + nb * BN;
      cp_async_wait<STAGES - 2>();  // block nb (and Q)
      __syncthreads();              // visible to all; everyone done with block nb-1's slot
      const int ahead = nb + STAGES - 1;
      const int ahead_stage = stage == 0 ? STAGES - 1 : stage - 1;  // the slot of block nb-1
      if (ahead < num_kv_blocks) {
        load_kv(k_tile(ahead_stage), k, k_begin + ahead * BN, ahead_at);
        load_kv(v_tile(ahead_stage), v, k_begin + ahead * BN, ahead_at);
      }
      cp_async_commit();
      if constexpr (PAGED)
        if (ahead + 1 < num_kv_blocks) ahead_at = block_at(k_begin + (ahead + 1) * BN);
      float s[1][T::kSTiles][4];
      scores(s, k_tile(stage), n0);
      fa2::online_softmax<T>(s, m, l, o, scale_log2);
      fa2::gemm_pv<T>(o, s, v_tile(stage) + warp_keys + a_lane);
      stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
  }

  // Merge the warps' (m, l, O) per row. m is the row max over the quad already; l is per lane.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = l[0][h];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (tig == 0) {
      row_max[warp * ROWS + g + 8 * h] = m[0][h];
      row_sum[warp * ROWS + g + 8 * h] = lt;
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the statistics are visible; every warp is done with the K/V tiles that obuf overlays
  float lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, row_max[w * ROWS + r]);
    const float base = (mx == neg_inf()) ? 0.f : mx * scale_log2;  // a row without keys: weights 0, no NaN
    float lsum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) lsum += row_sum[w * ROWS + r] * fast_exp2(fmaf(row_max[w * ROWS + r], scale_log2, -base));
    const float f = lsum > 0.f ? fast_exp2(fmaf(m[0][h], scale_log2, -base)) / lsum : 0.f;
    float* dst = obuf + (warp * ROWS + r) * T::kMergeStride + 2 * tig;
#pragma unroll
    for (int dt = 0; dt < T::kOTiles; ++dt) det::st_shared_f32x2(dst + 8 * dt, o[0][dt][2 * h] * f, o[0][dt][2 * h + 1] * f);
    // A row that sees no key of this split: LSE -inf (an empty split); with one split, the whole row
    // is masked: +inf, the harness's rule.
    lse[h] = lsum > 0.f ? fmaf(mx, scale_log2, fast_log2(lsum)) * kLn2 : (SPLITS == 1 ? pos_inf() : neg_inf());
  }

  // Output pointers formed here, not kept live through the loop.
  const long long total_rows = static_cast<long long>(p.batch) * p.heads * seq_q;  // B*H*Sq
  const long long first_row = group_first + row0;                                 // flat row of tile row 0
  if (warp == 0 && tig == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (r < rows_here) {
        if constexpr (SPLITS == 1) p.lse[first_row + r] = lse[h];
        else p.workspace[SPLITS * total_rows * D + (first_row + r) * SPLITS + split] = lse[h];
      }
    }
  }
  __syncthreads();  // every warp's scaled O tile is in obuf

  constexpr int kWarpStride = ROWS * T::kMergeStride;
  if constexpr (SPLITS == 1) {
    // 16-bit O, a 16-byte store of 8 columns per thread and step.
    constexpr int CH = D / 8;
    unsigned short* o_out = static_cast<unsigned short*>(p.o) + first_row * D;
#pragma unroll
    for (int it = 0; it < ceil_div(ROWS * CH, NT); ++it) {
      const int idx = tid + it * NT;
      const int r = idx / CH, c = idx % CH;
      if (((ROWS * CH) % NT == 0 || idx < ROWS * CH) && r < rows_here) {
        const float* src = obuf + r * T::kMergeStride + 8 * c;
        const float4 a = det::sum_over_warps<WARPS>(src, kWarpStride);
        const float4 b = det::sum_over_warps<WARPS>(src + 4, kWarpStride);
        uint4 packed;
        packed.x = pack_half2<T::kDtype>(a.x, a.y);
        packed.y = pack_half2<T::kDtype>(a.z, a.w);
        packed.z = pack_half2<T::kDtype>(b.x, b.y);
        packed.w = pack_half2<T::kDtype>(b.z, b.w);
        *reinterpret_cast<uint4*>(o_out + static_cast<long long>(r) * D + 8 * c) = packed;
      }
    }
  } else {
    // fp32 O_s of this split, a 16-byte store of 4 columns per thread and step.
    constexpr int C4 = D / 4;
    float* o_ws = p.workspace + (split * total_rows + first_row) * D;
#pragma unroll
    for (int it = 0; it < ceil_div(ROWS * C4, NT); ++it) {
      const int idx = tid + it * NT;
      const int r = idx / C4, c = idx % C4;
      if (((ROWS * C4) % NT == 0 || idx < ROWS * C4) && r < rows_here)
        *reinterpret_cast<float4*>(o_ws + static_cast<long long>(r) * D + 4 * c) =
            det::sum_over_warps<WARPS>(obuf + r * T::kMergeStride + 4 * c, kWarpStride);
    }
  }
}

// (threads, 1) here too: with the thread count alone ptxas capped the d = 256, SPLITS 128 combine at 48
// registers with a 4-byte spill on sm_80.
// The paged form's combine is the dense one (it reads the workspace only) on the paged argument.
template <class Traits, bool PAGED = false>
__global__ void __launch_bounds__(32 * kDecodeCombineWarps, 1)
    decode_splitkv_combine(const typename PagedParamsOf<PAGED, AttnFwdParams>::type p) {
  using T = Traits;
  namespace det = decode_splitkv_detail;
  constexpr int D = T::kHeadDim;
  constexpr int SPLITS = T::kSplits;
  constexpr int COLS = D / 32;                // columns per lane
  constexpr int SW = ceil_div(SPLITS, 32);    // splits per lane (LSE_s of split 32k + lane in w[k])
  const int lane = threadIdx.x & 31;
  const int rows_per_batch = p.heads * p.seq_q;
  const int rb = static_cast<int>(blockIdx.x) * kDecodeCombineWarps + static_cast<int>(threadIdx.x >> 5);
  if (rb >= rows_per_batch) return;  // the whole warp; no barrier below
  const long long total_rows = static_cast<long long>(p.batch) * rows_per_batch;
  const long long row = static_cast<long long>(blockIdx.z) * rows_per_batch + rb;  // flat (b, h, i)
  const float* lse_s = p.workspace + SPLITS * total_rows * D + row * SPLITS;

  float w[SW];
  float mx = neg_inf();
#pragma unroll
  for (int kk = 0; kk < SW; ++kk) {
    const int s = 32 * kk + lane;
    w[kk] = (SPLITS % 32 == 0 || s < SPLITS) ? lse_s[s] : neg_inf();
    mx = fmaxf(mx, w[kk]);
  }
  mx = group_max<32>(mx);

  float acc[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) acc[c] = 0.f;
  float lse = pos_inf();  // every split empty: O = 0, LSE = +inf
  if (mx != neg_inf()) {  // the same for every lane
    float sum = 0.f;
#pragma unroll
    for (int kk = 0; kk < SW; ++kk) {
      w[kk] = fast_exp2((w[kk] - mx) * kLog2e);  // exp(LSE_s - max); an empty split: exp2(-inf) = 0
      sum += w[kk];
    }
    sum = group_sum<32>(sum);  // >= 1: the largest split contributes exp(0)
    const float* o_s = p.workspace + row * D + lane * COLS;
#pragma unroll
    for (int kk = 0; kk < SW; ++kk) {
      const int n = SPLITS - 32 * kk < 32 ? SPLITS - 32 * kk : 32;
      for (int j = 0; j < n; ++j) {
        const float ws = __shfl_sync(0xffffffffu, w[kk], j);
        if (ws > 0.f) {  // warp-uniform: empty splits (and weights below fp32's range) are not read
          float x[COLS];
          det::load_cols<COLS>(x, o_s + (32 * kk + j) * total_rows * D);
#pragma unroll
          for (int c = 0; c < COLS; ++c) acc[c] = fmaf(ws, x[c], acc[c]);
        }
      }
    }
    const float inv = 1.f / sum;
#pragma unroll
    for (int c = 0; c < COLS; ++c) acc[c] *= inv;
    lse = fmaf(fast_log2(sum), kLn2, mx);
  }
  det::store_cols<T::kDtype, COLS>(static_cast<unsigned short*>(p.o) + row * D + lane * COLS, acc);
  if (lane == 0) p.lse[row] = lse;
}

}  // namespace flashtune
