// Tunables, derived constants and launch geometry of fa2_mma_fwd (FlashAttention-2 forward
// on tensor cores: mma.sync m16n8k16, fp16 or bf16 in, fp32 accumulation). Host-usable:
// plain constexpr C++, no device code. The kernel derives everything from these functions.
#pragma once
#include "traits_common.h"

namespace flashtune {

// Each warp owns BM/WARPS consecutive query rows: fa2_mma_m_tiles 16-row MMA tiles.
FT_HD constexpr int fa2_mma_threads(int WARPS) { return 32 * WARPS; }
FT_HD constexpr int fa2_mma_rows_per_warp(int BM, int WARPS) { return BM / WARPS; }
FT_HD constexpr int fa2_mma_m_tiles(int BM, int WARPS) { return fa2_mma_rows_per_warp(BM, WARPS) / 16; }

// Shared memory, 16-bit elements, rows of D/8 16-byte chunks, one of two conflict-free layouts
// for ldmatrix (see fa2_mma.cuh, SmemLayout):
//  - D <= 128: rows padded by one chunk (row stride 2*(D+8) bytes). Every ldmatrix address is
//    one register plus an immediate: fewest registers, which the 32-rows-per-warp tiles need.
//  - D >= 192: rows unpadded, chunks XOR-swizzled. One LOP3 per k slice, less shared memory;
//    measured 5-12% faster at D = 256 (16 rows per warp, registers to spare).
// Layout: Qs[BM] rows (reused to stage O in the epilogue) + STAGES x (Ks[BN] + Vs[BN] rows).
FT_HD constexpr bool fa2_mma_swizzled(int D) { return D >= 192; }
FT_HD constexpr int fa2_mma_row_bytes(int D) { return fa2_mma_swizzled(D) ? 2 * D : 2 * (D + 8); }
FT_HD constexpr int fa2_mma_smem_bytes(int D, int BM, int BN, int STAGES) {
  return fa2_mma_row_bytes(D) * (BM + 2 * STAGES * BN);
}

// Grid: x = query blocks (the kernel reverses the order when causal), y = heads, z = batch.
FT_HD constexpr GridDims fa2_mma_grid(int batch, int heads, int seq_q, int BM) {
  return GridDims{ceil_div(seq_q, BM), heads, batch};
}

// fp32 accumulator registers per thread: O (MT x D/8 n8-tiles x 4) + S (MT x BN/8 x 4).
FT_HD constexpr int fa2_mma_acc_regs(int D, int BM, int BN, int WARPS) {
  return fa2_mma_m_tiles(BM, WARPS) * (D + BN) / 2;
}
// Q as MMA A-fragments for the whole K/V loop: MT x D/16 x 4 registers.
FT_HD constexpr int fa2_mma_q_regs(int D, int BM, int WARPS) { return fa2_mma_m_tiles(BM, WARPS) * D / 4; }
constexpr int kFa2MmaMaxAccRegs = 192;
// Q stays in registers when accumulators + Q fit this budget; otherwise every K/V block
// re-reads Q's fragments from shared memory with ldmatrix (FlashAttention-2's default).
constexpr int kFa2MmaQRegsBudget = 160;
FT_HD constexpr bool fa2_mma_q_in_regs(int D, int BM, int BN, int WARPS) {
  return fa2_mma_acc_regs(D, BM, BN, WARPS) + fa2_mma_q_regs(D, BM, WARPS) <= kFa2MmaQRegsBudget;
}

// A window (AttnModTraits' WINDOW, WindowBand): the key blocks the query block at row m0 reads, [first, first +
// count): those that hold a key some of its rows [m0, min(m0 + BM, seq_q)) see, so that a window's work scales with
// it. Of those, a block needs per-element masking for a warp's rows [row0, row0 + rows) iff it holds a key past
// seq_k or some (row, key) pair of it lies outside the band (fa2_mma_window_masks); every other block of the span
// is wholly visible to those rows. Host-usable: tests/test_space.cpp holds both to Problem::visible_keys.
struct BlockSpan {
  int first, count;
};
FT_HD constexpr BlockSpan fa2_mma_window_blocks(const WindowBand& band, int m0, int BM, int BN, int seq_q, int seq_k) {
  const IndexRange keys = band.keys_of_rows(m0, m0 + BM < seq_q ? m0 + BM : seq_q, seq_k);
  return keys.empty() ? BlockSpan{0, 0} : BlockSpan{keys.first / BN, ceil_div(keys.end, BN) - keys.first / BN};
}
FT_HD constexpr bool fa2_mma_window_masks(const WindowBand& band, int row0, int rows, int n0, int BN, int seq_k) {
  return n0 + BN > seq_k || row0 + rows - 1 + band.lo > n0 || row0 + band.hi < n0 + BN - 1;
}

// Individual validity conditions (shared by fa2_mma_check and the traits' static_asserts).
FT_HD constexpr bool fa2_mma_d_ok(int D) {
  return D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256;
}
FT_HD constexpr bool fa2_mma_warps_ok(int WARPS) { return WARPS == 1 || WARPS == 2 || WARPS == 4 || WARPS == 8; }
FT_HD constexpr bool fa2_mma_bm_ok(int BM, int WARPS) { return BM > 0 && BM % (16 * WARPS) == 0; }
FT_HD constexpr bool fa2_mma_bn_ok(int BN) { return BN >= 16 && BN <= 256 && BN % 16 == 0; }
FT_HD constexpr bool fa2_mma_stages_ok(int STAGES) { return STAGES >= 1 && STAGES <= 3; }
FT_HD constexpr bool fa2_mma_acc_ok(int D, int BM, int BN, int WARPS) {
  return fa2_mma_acc_regs(D, BM, BN, WARPS) <= kFa2MmaMaxAccRegs;
}
FT_HD constexpr bool fa2_mma_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }

// nullptr if the combination is valid, else the reason. The device's shared-memory limit is
// not applied here (the host prunes per arch with fa2_mma_smem_bytes).
FT_HD constexpr const char* fa2_mma_check(int D, int BM, int BN, int WARPS, int STAGES) {
  return !fa2_mma_d_ok(D)                  ? "D must be 32, 64, 96, 128, 192 or 256"
         : !fa2_mma_warps_ok(WARPS)        ? "WARPS must be 1, 2, 4 or 8"
         : !fa2_mma_bm_ok(BM, WARPS)       ? "BLOCK_M must be a positive multiple of 16*WARPS"
         : !fa2_mma_bn_ok(BN)              ? "BLOCK_N must be a multiple of 16 in 16..256"
         : !fa2_mma_stages_ok(STAGES)      ? "STAGES must be 1, 2 or 3"
         : !fa2_mma_acc_ok(D, BM, BN, WARPS) ? "(BM/WARPS/16)*(D+BN)/2 fp32 accumulators too many (> 192)"
                                             : nullptr;
}

// DTYPE: 0 = fp16, 1 = bf16 (q, k, v, o); lse fp32; fp32 accumulation.
template <int D, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, int DTYPE, bool CAUSAL>
struct Fa2MmaTraits {
  static_assert(fa2_mma_d_ok(D), "D must be 32, 64, 96, 128, 192 or 256");
  static_assert(fa2_mma_warps_ok(WARPS), "WARPS must be 1, 2, 4 or 8");
  static_assert(fa2_mma_bm_ok(BLOCK_M, WARPS), "BLOCK_M must be a positive multiple of 16*WARPS");
  static_assert(fa2_mma_bn_ok(BLOCK_N), "BLOCK_N must be a multiple of 16 in 16..256");
  static_assert(fa2_mma_stages_ok(STAGES), "STAGES must be 1, 2 or 3");
  static_assert(fa2_mma_acc_ok(D, BLOCK_M, BLOCK_N, WARPS),
                "(BM/WARPS/16)*(D+BN)/2 fp32 accumulators too many (> 192)");
  static_assert(fa2_mma_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");
  static_assert(fa2_mma_check(D, BLOCK_M, BLOCK_N, WARPS, STAGES) == nullptr, "invalid Fa2MmaTraits");

  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kThreads = fa2_mma_threads(WARPS);
  static constexpr int kRowsPerWarp = fa2_mma_rows_per_warp(BLOCK_M, WARPS);
  static constexpr int kMTiles = fa2_mma_m_tiles(BLOCK_M, WARPS);  // 16-row A tiles per warp
  static constexpr int kSTiles = BLOCK_N / 8;                       // n8 tiles of S per m-tile
  static constexpr int kOTiles = D / 8;                             // n8 tiles of O per m-tile
  static constexpr int kQkSlices = D / 16;                          // k16 steps of S = Q K^T
  static constexpr int kPvSlices = BLOCK_N / 16;                    // k16 steps of O += P V
  static constexpr int kChunksPerRow = D / 8;                       // 16-byte chunks of data per row
  static constexpr bool kQInRegs = fa2_mma_q_in_regs(D, BLOCK_M, BLOCK_N, WARPS);
  static constexpr bool kSwizzled = fa2_mma_swizzled(D);
  static constexpr int kRowBytes = fa2_mma_row_bytes(D);  // smem row stride
  static constexpr int kQBytes = kRowBytes * BLOCK_M;
  static constexpr int kTileBytes = kRowBytes * BLOCK_N;  // one K or V tile
  static constexpr int kSmemBytes = fa2_mma_smem_bytes(D, BLOCK_M, BLOCK_N, STAGES);
};

}  // namespace flashtune
