// Tunables, derived constants and launch geometry of the fa2_simt_bwd family (FlashAttention-2
// backward on CUDA cores, fp32): three kernels, launched in this order,
//   fa2_simt_bwd_preprocess  delta = rowsum(dO * O); zero dq_accum (DQ_MODE 0)
//   fa2_simt_bwd_dkdv        one CTA per K/V block: dK, dV (+ atomic dQ when DQ_MODE 0)
//   fa2_simt_bwd_dq          DQ_MODE 0: dQ = dq_accum; DQ_MODE 1: one CTA per query block,
//                            dQ recomputed in a fixed order (bitwise deterministic)
// Host-usable: plain constexpr C++, no device code. The kernels derive everything from these
// same functions. Every host function takes the same tunables (BM, BN, TM, TN, DQ_MODE);
// CAUSAL changes no geometry and is only a template parameter of the traits.
#pragma once
#include "traits_common.h"

namespace flashtune {

// Score tile of the dK/dV and dQ kernels, held TRANSPOSED: S^T is BN x BM (key rows, query
// columns). Threads form a TR x TC grid: TR = BN/TN rows of threads over keys, TC = BM/TM
// columns over queries; each thread owns TN x TM scores, TN rows of dK and dV, and BM/TR
// query rows of the dQ tile.
FT_HD constexpr int fa2_simt_bwd_tr(int BN, int TN) { return BN / TN; }
FT_HD constexpr int fa2_simt_bwd_tc(int BM, int TM) { return BM / TM; }
FT_HD constexpr int fa2_simt_bwd_main_threads(int BM, int BN, int TM, int TN) {
  return fa2_simt_bwd_tr(BN, TN) * fa2_simt_bwd_tc(BM, TM);
}
// Query rows of the dQ tile per thread (contiguous).
FT_HD constexpr int fa2_simt_bwd_qm(int BM, int BN, int TN) { return BM / fa2_simt_bwd_tr(BN, TN); }
// Row strides in floats: 4 floats of padding keep 16-byte shared-memory reads conflict free.
FT_HD constexpr int fa2_simt_bwd_row_stride(int D) { return D + 4; }
FT_HD constexpr int fa2_simt_bwd_p_stride(int BM) { return BM + 4; }

// The elementwise kernels (preprocess, DQ_MODE 0 copy): kBwdRowLanes lanes per row, each
// lane D/(4*kBwdRowLanes) float4 chunks of the row.
constexpr int kFa2SimtBwdRowThreads = 256;
constexpr int kFa2SimtBwdRowLanes = 8;
constexpr int kFa2SimtBwdRowsPerCta = kFa2SimtBwdRowThreads / kFa2SimtBwdRowLanes;  // 32

// Shared memory of a main kernel (dK/dV, and dQ in DQ_MODE 1): two (BN, D) tiles (K, V), two
// (BM, D) tiles (Q, dO) and one BN x BM score tile (P^T, then dS^T in the same buffer).
FT_HD constexpr int fa2_simt_bwd_main_smem_bytes(int D, int BM, int BN) {
  return 4 * (2 * BN * fa2_simt_bwd_row_stride(D) + 2 * BM * fa2_simt_bwd_row_stride(D) +
              BN * fa2_simt_bwd_p_stride(BM));
}
// Registers of the per-thread accumulators of the dK/dV kernel: P and dP tiles (2*TN*TM),
// dK and dV (2*TN*D/TC), the transient dQ tile (QM*D/TC, DQ_MODE 0). A rough pressure measure.
FT_HD constexpr int fa2_simt_bwd_acc_regs(int D, int BM, int BN, int TM, int TN, int DQ_MODE) {
  return 2 * TN * TM + 2 * TN * (D / fa2_simt_bwd_tc(BM, TM)) +
         (DQ_MODE == 0 ? fa2_simt_bwd_qm(BM, BN, TN) * (D / fa2_simt_bwd_tc(BM, TM)) : 0);
}
constexpr int kFa2SimtBwdMaxAccRegs = 144;
// CTAs per SM the main kernels ask ptxas for (__launch_bounds__ min blocks): 2 when two fit in
// shared memory (sm_90) and the accumulators are small enough for 65536 / (2 * threads)
// registers per thread, else 1 (up to 255 registers).
FT_HD constexpr int fa2_simt_bwd_min_blocks(int D, int BM, int BN, int TM, int TN, int DQ_MODE) {
  return (2 * (fa2_simt_bwd_main_smem_bytes(D, BM, BN) + 1024) <= kMaxSmemBytesSm90 + 1024 &&
          fa2_simt_bwd_main_threads(BM, BN, TM, TN) <= 256 &&
          fa2_simt_bwd_acc_regs(D, BM, BN, TM, TN, DQ_MODE) <= 48)
             ? 2
             : 1;
}

// ---- launch geometry, one set per kernel (same argument lists for all three) ----
FT_HD constexpr int fa2_simt_bwd_preprocess_threads(int, int, int, int, int) { return kFa2SimtBwdRowThreads; }
FT_HD constexpr int fa2_simt_bwd_preprocess_smem_bytes(int, int, int, int, int, int) { return 0; }
FT_HD constexpr GridDims fa2_simt_bwd_preprocess_grid(int batch, int heads, int seq_q, int, int, int, int, int,
                                                      int) {
  return GridDims{ceil_div(seq_q, kFa2SimtBwdRowsPerCta), heads, batch};
}

FT_HD constexpr int fa2_simt_bwd_dkdv_threads(int BM, int BN, int TM, int TN, int) {
  return fa2_simt_bwd_main_threads(BM, BN, TM, TN);
}
FT_HD constexpr int fa2_simt_bwd_dkdv_smem_bytes(int D, int BM, int BN, int, int, int) {
  return fa2_simt_bwd_main_smem_bytes(D, BM, BN);
}
// x = K/V blocks, y = heads, z = batch.
FT_HD constexpr GridDims fa2_simt_bwd_dkdv_grid(int batch, int heads, int, int seq_k, int, int BN, int, int, int) {
  return GridDims{ceil_div(seq_k, BN), heads, batch};
}

FT_HD constexpr int fa2_simt_bwd_dq_threads(int BM, int BN, int TM, int TN, int DQ_MODE) {
  return DQ_MODE == 0 ? kFa2SimtBwdRowThreads : fa2_simt_bwd_main_threads(BM, BN, TM, TN);
}
FT_HD constexpr int fa2_simt_bwd_dq_smem_bytes(int D, int BM, int BN, int, int, int DQ_MODE) {
  return DQ_MODE == 0 ? 0 : fa2_simt_bwd_main_smem_bytes(D, BM, BN);
}
// DQ_MODE 0: x = blocks of kFa2SimtBwdRowsPerCta rows; DQ_MODE 1: x = query blocks. y = heads, z = batch.
FT_HD constexpr GridDims fa2_simt_bwd_dq_grid(int batch, int heads, int seq_q, int, int BM, int, int, int,
                                              int DQ_MODE) {
  return GridDims{DQ_MODE == 0 ? ceil_div(seq_q, kFa2SimtBwdRowsPerCta) : ceil_div(seq_q, BM), heads, batch};
}

// Individual validity conditions (shared by fa2_simt_bwd_check and the traits' static_asserts).
FT_HD constexpr bool fa2_simt_bwd_d_ok(int D) { return D == 32 || D == 64 || D == 96 || D == 128; }
FT_HD constexpr bool fa2_simt_bwd_tiles_ok(int BM, int BN, int TM, int TN) {
  return BM > 0 && BN > 0 && TM > 0 && TN > 0 && BM % TM == 0 && BN % TN == 0;
}
FT_HD constexpr bool fa2_simt_bwd_mode_ok(int DQ_MODE) { return DQ_MODE == 0 || DQ_MODE == 1; }
FT_HD constexpr bool fa2_simt_bwd_tc_ok(int BM, int TM) { return 32 % fa2_simt_bwd_tc(BM, TM) == 0; }
FT_HD constexpr bool fa2_simt_bwd_threads_mult32(int BM, int BN, int TM, int TN) {
  return fa2_simt_bwd_main_threads(BM, BN, TM, TN) % 32 == 0;
}
FT_HD constexpr bool fa2_simt_bwd_threads_range(int BM, int BN, int TM, int TN) {
  return fa2_simt_bwd_main_threads(BM, BN, TM, TN) >= 64 && fa2_simt_bwd_main_threads(BM, BN, TM, TN) <= 512;
}
FT_HD constexpr bool fa2_simt_bwd_dtc_ok(int D, int BM, int TM) { return D % (4 * fa2_simt_bwd_tc(BM, TM)) == 0; }
FT_HD constexpr bool fa2_simt_bwd_bm4_ok(int BM) { return BM % 4 == 0; }
FT_HD constexpr bool fa2_simt_bwd_qm_ok(int BM, int BN, int TN) { return BM % fa2_simt_bwd_tr(BN, TN) == 0; }
FT_HD constexpr bool fa2_simt_bwd_tile_regs_ok(int TM, int TN) { return TM * TN <= 32; }
FT_HD constexpr bool fa2_simt_bwd_acc_regs_ok(int D, int BM, int BN, int TM, int TN, int DQ_MODE) {
  return fa2_simt_bwd_acc_regs(D, BM, BN, TM, TN, DQ_MODE) <= kFa2SimtBwdMaxAccRegs;
}

// nullptr if the combination is valid, else the reason. No shared-memory limit is folded in:
// compare fa2_simt_bwd_{dkdv,dq}_smem_bytes with the device's limit on the host.
FT_HD constexpr const char* fa2_simt_bwd_check(int D, int BM, int BN, int TM, int TN, int DQ_MODE) {
  return !fa2_simt_bwd_d_ok(D)                          ? "D must be 32, 64, 96 or 128"
         : !fa2_simt_bwd_tiles_ok(BM, BN, TM, TN)       ? "BM % TM != 0 or BN % TN != 0"
         : !fa2_simt_bwd_mode_ok(DQ_MODE)               ? "DQ_MODE must be 0 or 1"
         : !fa2_simt_bwd_tc_ok(BM, TM)                  ? "TC = BM/TM does not divide 32"
         : !fa2_simt_bwd_threads_mult32(BM, BN, TM, TN) ? "threads not a multiple of 32"
         : !fa2_simt_bwd_threads_range(BM, BN, TM, TN)  ? "threads outside 64..512"
         : !fa2_simt_bwd_dtc_ok(D, BM, TM)              ? "D % (4*TC) != 0"
         : !fa2_simt_bwd_bm4_ok(BM)                     ? "BM % 4 != 0"
         : !fa2_simt_bwd_qm_ok(BM, BN, TN)              ? "BM % TR != 0 (TR = BN/TN)"
         : !fa2_simt_bwd_tile_regs_ok(TM, TN)           ? "TM*TN register tile too large (> 32)"
         : !fa2_simt_bwd_acc_regs_ok(D, BM, BN, TM, TN, DQ_MODE)
             ? "accumulators 2*TN*TM + 2*TN*D/TC (+ QM*D/TC) too large (> 144)"
             : nullptr;
}

template <int D, int BLOCK_M, int BLOCK_N, int TM, int TN, int DQ_MODE, bool CAUSAL>
struct Fa2SimtBwdTraits {
  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;  // query rows per block
  static constexpr int kBlockN = BLOCK_N;  // key rows per block
  static constexpr int kTM = TM;           // query columns of S^T per thread
  static constexpr int kTN = TN;           // key rows of S^T (and of dK, dV) per thread
  static constexpr int kDqMode = DQ_MODE;  // 0: atomic dq_accum; 1: deterministic dQ kernel
  static constexpr bool kCausal = CAUSAL;

  static_assert(fa2_simt_bwd_d_ok(D), "D must be 32, 64, 96 or 128");
  static_assert(fa2_simt_bwd_tiles_ok(BLOCK_M, BLOCK_N, TM, TN), "BM % TM != 0 or BN % TN != 0");
  static_assert(fa2_simt_bwd_mode_ok(DQ_MODE), "DQ_MODE must be 0 or 1");
  static_assert(fa2_simt_bwd_tc_ok(BLOCK_M, TM), "TC = BM/TM does not divide 32");
  static_assert(fa2_simt_bwd_threads_mult32(BLOCK_M, BLOCK_N, TM, TN), "threads not a multiple of 32");
  static_assert(fa2_simt_bwd_threads_range(BLOCK_M, BLOCK_N, TM, TN), "threads outside 64..512");
  static_assert(fa2_simt_bwd_dtc_ok(D, BLOCK_M, TM), "D % (4*TC) != 0");
  static_assert(fa2_simt_bwd_bm4_ok(BLOCK_M), "BM % 4 != 0");
  static_assert(fa2_simt_bwd_qm_ok(BLOCK_M, BLOCK_N, TN), "BM % TR != 0 (TR = BN/TN)");
  static_assert(fa2_simt_bwd_tile_regs_ok(TM, TN), "TM*TN register tile too large (> 32)");
  static_assert(fa2_simt_bwd_acc_regs_ok(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE),
                "accumulators 2*TN*TM + 2*TN*D/TC (+ QM*D/TC) too large (> 144)");
  static_assert(fa2_simt_bwd_check(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE) == nullptr, "invalid Fa2SimtBwdTraits");

  static constexpr int kTR = fa2_simt_bwd_tr(BLOCK_N, TN);
  static constexpr int kTC = fa2_simt_bwd_tc(BLOCK_M, TM);
  static constexpr int kQM = fa2_simt_bwd_qm(BLOCK_M, BLOCK_N, TN);
  static constexpr int kChunks = D / (4 * kTC);  // float4 columns per owned row of dK, dV, dQ
  static constexpr int kRowStride = fa2_simt_bwd_row_stride(D);
  static constexpr int kPStride = fa2_simt_bwd_p_stride(BLOCK_M);

  static constexpr int kMainThreads = fa2_simt_bwd_main_threads(BLOCK_M, BLOCK_N, TM, TN);
  static constexpr int kPreThreads = fa2_simt_bwd_preprocess_threads(BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kDkdvThreads = fa2_simt_bwd_dkdv_threads(BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kDqThreads = fa2_simt_bwd_dq_threads(BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kPreSmemBytes = fa2_simt_bwd_preprocess_smem_bytes(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kDkdvSmemBytes = fa2_simt_bwd_dkdv_smem_bytes(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kDqSmemBytes = fa2_simt_bwd_dq_smem_bytes(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kMinBlocks = fa2_simt_bwd_min_blocks(D, BLOCK_M, BLOCK_N, TM, TN, DQ_MODE);
  static constexpr int kRowLanes = kFa2SimtBwdRowLanes;
  static constexpr int kRowsPerCta = kFa2SimtBwdRowsPerCta;
  static constexpr int kRowChunks = D / (4 * kFa2SimtBwdRowLanes);  // float4 chunks per lane in the row kernels
};

}  // namespace flashtune
