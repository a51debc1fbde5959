// Tunables, derived constants and launch geometry of the fa2_mma_bwd family (FlashAttention-2
// backward on tensor cores: mma.sync m16n8k16, fp16 or bf16 in and out, fp32 accumulation).
// Three kernels, launched in this order,
//   fa2_mma_bwd_preprocess  delta = rowsum(dO * O) (fp32); DQ_MODE 0: zero dq_accum
//   fa2_mma_bwd_dkdv        one CTA per K/V block: dK, dV (+ fp32 atomics into dq_accum, DQ_MODE 0)
//   fa2_mma_bwd_dq          DQ_MODE 0: dQ = 16-bit(dq_accum); DQ_MODE 1: one CTA per query block,
//                           dQ recomputed in a fixed order (bitwise deterministic, no atomics)
// Host-usable: plain constexpr C++, no device code. Every host function takes the same tunables
// (BM, BN, WARPS, DSPLIT, STAGES, DQ_MODE); DTYPE and CAUSAL change no geometry.
//
// dK/dV kernel: the WARPS warps form (WARPS/DSPLIT) key groups x DSPLIT column groups. Key group
// wk owns key rows [16*MTN*wk, 16*MTN*(wk+1)) of the BN-row K/V block (MTN = BN/(16*WARPS/DSPLIT)
// m16 tiles) and computes S^T, dP^T for them over the whole query block (BM columns); the DSPLIT
// warps of a group share those rows and each accumulates D/DSPLIT columns of dK and dV (DSPLIT > 1
// recomputes S^T and dP^T per warp: meant for d = 192, 256 where 16 rows x 2D fp32 do not fit).
#pragma once
#include "traits_common.h"

namespace flashtune {

FT_HD constexpr int fa2_mma_bwd_min(int a, int b) { return a < b ? a : b; }

// Shared-memory rows of D 16-bit values padded by 8 (one 16-byte chunk, odd chunk count per row:
// ldmatrix conflict free).
FT_HD constexpr int fa2_mma_bwd_row_bytes(int D) { return 2 * (D + 8); }
// dS^T tile (BN x BM, 16-bit) for the DQ_MODE 0 dQ product, rows padded by 8.
FT_HD constexpr int fa2_mma_bwd_ds_row_bytes(int BM) { return 2 * (BM + 8); }

// ---- dK/dV kernel geometry ----
FT_HD constexpr int fa2_mma_bwd_key_warps(int WARPS, int DSPLIT) { return DSPLIT > 0 ? WARPS / DSPLIT : 0; }
// m16 key tiles per warp.
FT_HD constexpr int fa2_mma_bwd_key_tiles(int BN, int WARPS, int DSPLIT) {
  return fa2_mma_bwd_key_warps(WARPS, DSPLIT) > 0 ? BN / (16 * fa2_mma_bwd_key_warps(WARPS, DSPLIT)) : 0;
}
// fp32 accumulators per thread in the main loop: dK + dV (MTN*D/DSPLIT) + S^T + dP^T (MTN*BM).
FT_HD constexpr int fa2_mma_bwd_dkdv_acc_regs(int D, int BM, int BN, int WARPS, int DSPLIT) {
  return fa2_mma_bwd_key_tiles(BN, WARPS, DSPLIT) * (D / DSPLIT + BM);
}
// DQ_MODE 0: the dQ_i += dS K_j product in the dK/dV kernel, output BM x D over WQM x WQD warps.
FT_HD constexpr int fa2_mma_bwd_dqa_warps_m(int BM, int WARPS) { return fa2_mma_bwd_min(WARPS, BM / 16); }
FT_HD constexpr int fa2_mma_bwd_dqa_warps_d(int BM, int WARPS) {
  return fa2_mma_bwd_dqa_warps_m(BM, WARPS) > 0 ? WARPS / fa2_mma_bwd_dqa_warps_m(BM, WARPS) : 0;
}
// Registers live during that product: dK + dV + the transient dQ tile (BM*D/(32*WARPS)).
FT_HD constexpr int fa2_mma_bwd_dqa_acc_regs(int D, int BM, int BN, int WARPS, int DSPLIT) {
  return fa2_mma_bwd_key_tiles(BN, WARPS, DSPLIT) * D / DSPLIT + BM * D / (32 * WARPS);
}

// ---- DQ_MODE 1 dQ kernel geometry: min(WARPS, BM/16) warps, each MTQ m16 query tiles; key
// blocks of KS keys (the largest power of two <= BN, >= 16, keeping MTQ*(D/2 + KS) <= 144: beyond
// that ptxas spilled, e.g. D=64 with KS=128, D=256 with KS=32). ----
FT_HD constexpr int fa2_mma_bwd_dq_warps(int BM, int WARPS) { return fa2_mma_bwd_min(WARPS, BM / 16); }
FT_HD constexpr int fa2_mma_bwd_dq_m_tiles(int BM, int WARPS) {
  return fa2_mma_bwd_dq_warps(BM, WARPS) > 0 ? BM / (16 * fa2_mma_bwd_dq_warps(BM, WARPS)) : 0;
}
constexpr int kFa2MmaBwdDqAccBudget = 144;
// A modified variant's (AttnModTraits) registers beside them: the band, the slope, the cap's scales and the
// per-element mask and distance; at d 128 with all three the budget above left ptxas at 255 and spilling on sm_90.
constexpr int kFa2MmaBwdDqModRegs = 32;
FT_HD constexpr int fa2_mma_bwd_dq_key_step(int D, int BM, int BN, int WARPS, bool MODS = false) {
  int ks = 0;
  const int budget = kFa2MmaBwdDqAccBudget - (MODS ? kFa2MmaBwdDqModRegs : 0);
  for (int c = 256; c >= 16; c /= 2)
    if (ks == 0 && c <= BN && fa2_mma_bwd_dq_m_tiles(BM, WARPS) * (D / 2 + c) <= budget) ks = c;
  return ks;  // 0: none fits
}

// Elementwise kernels (preprocess; DQ_MODE 0 conversion): 256 threads, 8 lanes per row, 32 rows per CTA.
constexpr int kFa2MmaBwdRowThreads = 256;
constexpr int kFa2MmaBwdRowLanes = 8;
constexpr int kFa2MmaBwdRowsPerCta = kFa2MmaBwdRowThreads / kFa2MmaBwdRowLanes;

constexpr int kFa2MmaBwdMaxAccRegs = 192;

// ---- launch geometry, one set per kernel (same argument lists for all three) ----
FT_HD constexpr int fa2_mma_bwd_preprocess_threads(int, int, int, int, int, int) { return kFa2MmaBwdRowThreads; }
FT_HD constexpr int fa2_mma_bwd_preprocess_smem_bytes(int, int, int, int, int, int, int) { return 0; }
FT_HD constexpr GridDims fa2_mma_bwd_preprocess_grid(int batch, int heads, int seq_q, int, int, int, int, int, int,
                                                     int) {
  return GridDims{ceil_div(seq_q, kFa2MmaBwdRowsPerCta), heads, batch};
}

FT_HD constexpr int fa2_mma_bwd_dkdv_threads(int, int, int WARPS, int, int, int) { return 32 * WARPS; }
// K, V [BN][D+8]; STAGES x (Q, dO [BM][D+8]); DQ_MODE 0: dS^T [BN][BM+8]; STAGES x (lse, delta [BM] fp32).
FT_HD constexpr int fa2_mma_bwd_dkdv_smem_bytes(int D, int BM, int BN, int, int, int STAGES, int DQ_MODE) {
  return fa2_mma_bwd_row_bytes(D) * (2 * BN + 2 * STAGES * BM) +
         (DQ_MODE == 0 ? BN * fa2_mma_bwd_ds_row_bytes(BM) : 0) + 8 * STAGES * BM;
}
// x = K/V blocks, y = heads, z = batch.
FT_HD constexpr GridDims fa2_mma_bwd_dkdv_grid(int batch, int heads, int, int seq_k, int, int BN, int, int, int,
                                               int) {
  return GridDims{ceil_div(seq_k, BN), heads, batch};
}

FT_HD constexpr int fa2_mma_bwd_dq_threads(int BM, int, int WARPS, int, int, int DQ_MODE) {
  return DQ_MODE == 0 ? kFa2MmaBwdRowThreads : 32 * fa2_mma_bwd_dq_warps(BM, WARPS);
}
// DQ_MODE 1: Q, dO [BM][D+8]; STAGES x (K, V [KS][D+8]).
FT_HD constexpr int fa2_mma_bwd_dq_smem_bytes(int D, int BM, int BN, int WARPS, int, int STAGES, int DQ_MODE) {
  return DQ_MODE == 0 ? 0
                      : fa2_mma_bwd_row_bytes(D) * (2 * BM + 2 * STAGES * fa2_mma_bwd_dq_key_step(D, BM, BN, WARPS));
}
// DQ_MODE 0: x = blocks of 32 rows; DQ_MODE 1: x = query blocks of BM (reversed in the kernel when
// causal). y = heads, z = batch.
FT_HD constexpr GridDims fa2_mma_bwd_dq_grid(int batch, int heads, int seq_q, int, int BM, int, int, int, int,
                                             int DQ_MODE) {
  return GridDims{DQ_MODE == 0 ? ceil_div(seq_q, kFa2MmaBwdRowsPerCta) : ceil_div(seq_q, BM), heads, batch};
}

// ---- score modifications (issue 32): a window (AttnModTraits' WINDOW, WindowBand) ----
// The dK/dV kernel's CTA at key n0 walks the query blocks [first, end) whose rows see some key of
// [n0, min(n0 + BN, seq_k)) (n0 < seq_k): WindowBand::rows_of_keys in blocks of BM; empty (no row sees the block:
// dK = dV = 0) when end <= first. The DQ_MODE 1 dQ kernel's query block at m0 (m0 < seq_q) reads the key steps [first,
// end) of KS keys that hold a key some of its rows see (keys_of_rows). Of a pair of tiles, rows [row0, row0 + rows)
// and keys [n0, n0 + keys), masking is needed iff some key lies past seq_k or some (row, key) pair outside the band
// (fa2_mma_bwd_window_masks, the same test both ways: rows past seq_q only make it conservative). Host-usable:
// tests/test_space.cpp holds all three to Problem::visible_keys.
FT_HD constexpr IndexRange fa2_mma_bwd_window_query_blocks(const WindowBand& band, int n0, int BM, int BN, int seq_q,
                                                           int seq_k) {
  const IndexRange rows = band.rows_of_keys(n0, n0 + BN < seq_k ? n0 + BN : seq_k, seq_q);
  return rows.empty() ? IndexRange{0, 0} : IndexRange{rows.first / BM, ceil_div(rows.end, BM)};
}
FT_HD constexpr IndexRange fa2_mma_bwd_window_key_blocks(const WindowBand& band, int m0, int BM, int KS, int seq_q,
                                                         int seq_k) {
  const IndexRange keys = band.keys_of_rows(m0, m0 + BM < seq_q ? m0 + BM : seq_q, seq_k);
  return keys.empty() ? IndexRange{0, 0} : IndexRange{keys.first / KS, ceil_div(keys.end, KS)};
}
FT_HD constexpr bool fa2_mma_bwd_window_masks(const WindowBand& band, int row0, int rows, int n0, int keys, int seq_k) {
  return n0 + keys > seq_k || row0 + rows - 1 + band.lo > n0 || row0 + band.hi < n0 + keys - 1;
}

// ---- individual validity conditions (shared by fa2_mma_bwd_check and the traits' static_asserts) ----
FT_HD constexpr bool fa2_mma_bwd_d_ok(int D) {
  return D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256;
}
FT_HD constexpr bool fa2_mma_bwd_warps_ok(int WARPS) { return WARPS == 1 || WARPS == 2 || WARPS == 4 || WARPS == 8; }
FT_HD constexpr bool fa2_mma_bwd_dsplit_ok(int D, int WARPS, int DSPLIT) {
  return (DSPLIT == 1 || DSPLIT == 2 || DSPLIT == 4) && WARPS % DSPLIT == 0 && D % (16 * DSPLIT) == 0;
}
FT_HD constexpr bool fa2_mma_bwd_bm_ok(int BM) { return BM >= 16 && BM <= 256 && BM % 16 == 0; }
FT_HD constexpr bool fa2_mma_bwd_bn_ok(int BN, int WARPS, int DSPLIT) {
  return BN >= 16 && BN <= 256 && fa2_mma_bwd_key_warps(WARPS, DSPLIT) > 0 &&
         BN % (16 * fa2_mma_bwd_key_warps(WARPS, DSPLIT)) == 0;
}
FT_HD constexpr bool fa2_mma_bwd_stages_ok(int STAGES) { return STAGES == 1 || STAGES == 2; }
FT_HD constexpr bool fa2_mma_bwd_mode_ok(int DQ_MODE) { return DQ_MODE == 0 || DQ_MODE == 1; }
FT_HD constexpr bool fa2_mma_bwd_acc_ok(int D, int BM, int BN, int WARPS, int DSPLIT) {
  return fa2_mma_bwd_dkdv_acc_regs(D, BM, BN, WARPS, DSPLIT) <= kFa2MmaBwdMaxAccRegs;
}
// DQ_MODE 0: the dQ product's warp grid tiles BM x D in m16 x (multiple of 16) pieces, and its
// transient tile fits beside dK, dV.
FT_HD constexpr bool fa2_mma_bwd_dqa_ok(int D, int BM, int BN, int WARPS, int DSPLIT, int DQ_MODE) {
  return DQ_MODE != 0 ||
         ((BM / 16) % fa2_mma_bwd_dqa_warps_m(BM, WARPS) == 0 && WARPS % fa2_mma_bwd_dqa_warps_m(BM, WARPS) == 0 &&
          D % (16 * fa2_mma_bwd_dqa_warps_d(BM, WARPS)) == 0 &&
          fa2_mma_bwd_dqa_acc_regs(D, BM, BN, WARPS, DSPLIT) <= kFa2MmaBwdMaxAccRegs);
}
// DQ_MODE 1: the dQ kernel's warps tile BM in whole m16 tiles and some key step fits the budget.
FT_HD constexpr bool fa2_mma_bwd_dqk_ok(int D, int BM, int BN, int WARPS, int DQ_MODE) {
  return DQ_MODE != 1 ||
         ((BM / 16) % fa2_mma_bwd_dq_warps(BM, WARPS) == 0 && fa2_mma_bwd_dq_key_step(D, BM, BN, WARPS) >= 16);
}
FT_HD constexpr bool fa2_mma_bwd_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }

// nullptr if the combination is valid, else the reason. No shared-memory limit is folded in:
// compare fa2_mma_bwd_{dkdv,dq}_smem_bytes with the device's limit on the host.
FT_HD constexpr const char* fa2_mma_bwd_check(int D, int BM, int BN, int WARPS, int DSPLIT, int STAGES,
                                              int DQ_MODE) {
  return !fa2_mma_bwd_d_ok(D)                      ? "D must be 32, 64, 96, 128, 192 or 256"
         : !fa2_mma_bwd_warps_ok(WARPS)            ? "WARPS must be 1, 2, 4 or 8"
         : !fa2_mma_bwd_dsplit_ok(D, WARPS, DSPLIT) ? "DSPLIT must be 1, 2 or 4, divide WARPS, and D % (16*DSPLIT) == 0"
         : !fa2_mma_bwd_bm_ok(BM)                  ? "BLOCK_M must be a multiple of 16 in 16..256"
         : !fa2_mma_bwd_bn_ok(BN, WARPS, DSPLIT)   ? "BLOCK_N must be a multiple of 16*WARPS/DSPLIT in 16..256"
         : !fa2_mma_bwd_stages_ok(STAGES)          ? "STAGES must be 1 or 2"
         : !fa2_mma_bwd_mode_ok(DQ_MODE)           ? "DQ_MODE must be 0 or 1"
         : !fa2_mma_bwd_acc_ok(D, BM, BN, WARPS, DSPLIT)
             ? "dK/dV kernel accumulators MTN*(D/DSPLIT + BM) too many (> 192)"
         : !fa2_mma_bwd_dqa_ok(D, BM, BN, WARPS, DSPLIT, DQ_MODE)
             ? "DQ_MODE 0 dQ product: warps do not tile BM x D in 16 x 16 pieces, or dK+dV+dQ tile > 192 registers"
         : !fa2_mma_bwd_dqk_ok(D, BM, BN, WARPS, DQ_MODE)
             ? "DQ_MODE 1 dQ kernel: BM/16 not a multiple of its warps, or no key step fits MTQ*(D/2+KS) <= 144"
             : nullptr;
}

// DTYPE: 0 = fp16, 1 = bf16 (q, k, v, o, dout, dq, dk, dv); lse, delta, dq_accum fp32.
template <int D, int BLOCK_M, int BLOCK_N, int WARPS, int DSPLIT, int STAGES, int DQ_MODE, int DTYPE, bool CAUSAL>
struct Fa2MmaBwdTraits {
  static_assert(fa2_mma_bwd_d_ok(D), "D must be 32, 64, 96, 128, 192 or 256");
  static_assert(fa2_mma_bwd_warps_ok(WARPS), "WARPS must be 1, 2, 4 or 8");
  static_assert(fa2_mma_bwd_dsplit_ok(D, WARPS, DSPLIT),
                "DSPLIT must be 1, 2 or 4, divide WARPS, and D % (16*DSPLIT) == 0");
  static_assert(fa2_mma_bwd_bm_ok(BLOCK_M), "BLOCK_M must be a multiple of 16 in 16..256");
  static_assert(fa2_mma_bwd_bn_ok(BLOCK_N, WARPS, DSPLIT), "BLOCK_N must be a multiple of 16*WARPS/DSPLIT in 16..256");
  static_assert(fa2_mma_bwd_stages_ok(STAGES), "STAGES must be 1 or 2");
  static_assert(fa2_mma_bwd_mode_ok(DQ_MODE), "DQ_MODE must be 0 or 1");
  static_assert(fa2_mma_bwd_acc_ok(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT),
                "dK/dV kernel accumulators MTN*(D/DSPLIT + BM) too many (> 192)");
  static_assert(fa2_mma_bwd_dqa_ok(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, DQ_MODE),
                "DQ_MODE 0 dQ product: warps do not tile BM x D in 16 x 16 pieces, or dK+dV+dQ tile > 192 registers");
  static_assert(fa2_mma_bwd_dqk_ok(D, BLOCK_M, BLOCK_N, WARPS, DQ_MODE),
                "DQ_MODE 1 dQ kernel: BM/16 not a multiple of its warps, or no key step fits MTQ*(D/2+KS) <= 144");
  static_assert(fa2_mma_bwd_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");
  static_assert(fa2_mma_bwd_check(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE) == nullptr,
                "invalid Fa2MmaBwdTraits");

  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kWarps = WARPS;
  static constexpr int kDSplit = DSPLIT;
  static constexpr int kStages = STAGES;
  static constexpr int kDqMode = DQ_MODE;
  static constexpr bool kDqAccumSwizzled = false;  // dq_accum row-major (see fa2_wgmma_bwd's DQ_RED 3)
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kRowBytes = fa2_mma_bwd_row_bytes(D);
  static constexpr int kDsRowBytes = fa2_mma_bwd_ds_row_bytes(BLOCK_M);
  // dK/dV kernel
  static constexpr int kKeyTiles = fa2_mma_bwd_key_tiles(BLOCK_N, WARPS, DSPLIT);  // MTN
  static constexpr int kDCols = D / DSPLIT;                                         // dK/dV columns per warp
  static constexpr int kDqaWarpsM = fa2_mma_bwd_dqa_warps_m(BLOCK_M, WARPS);
  static constexpr int kDqaWarpsD = fa2_mma_bwd_dqa_warps_d(BLOCK_M, WARPS);
  static constexpr int kDqaRows = BLOCK_M / kDqaWarpsM;  // dQ product rows per warp (DQ_MODE 0)
  static constexpr int kDqaCols = D / kDqaWarpsD;        // dQ product columns per warp
  // DQ_MODE 1 dQ kernel
  static constexpr int kDqWarps = fa2_mma_bwd_dq_warps(BLOCK_M, WARPS);
  static constexpr int kDqMTiles = fa2_mma_bwd_dq_m_tiles(BLOCK_M, WARPS);
  static constexpr int kDqKeyStep = fa2_mma_bwd_dq_key_step(D, BLOCK_M, BLOCK_N, WARPS);

  static constexpr int kPreThreads = fa2_mma_bwd_preprocess_threads(BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kDkdvThreads = fa2_mma_bwd_dkdv_threads(BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kDqThreads = fa2_mma_bwd_dq_threads(BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kPreSmemBytes =
      fa2_mma_bwd_preprocess_smem_bytes(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kDkdvSmemBytes = fa2_mma_bwd_dkdv_smem_bytes(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kDqSmemBytes = fa2_mma_bwd_dq_smem_bytes(D, BLOCK_M, BLOCK_N, WARPS, DSPLIT, STAGES, DQ_MODE);
  static constexpr int kRowLanes = kFa2MmaBwdRowLanes;
  static constexpr int kRowsPerCta = kFa2MmaBwdRowsPerCta;
};

}  // namespace flashtune
