// Tunables, derived constants and launch geometry of fa1_simt_fwd (FlashAttention-1's loop
// order on CUDA cores, fp32). Host-usable: plain constexpr C++, no device code.
// The kernel derives everything from these same functions.
#pragma once
#include "traits_common.h"

namespace flashtune {

// Threads form a TR x TC grid: TR = BM/TM rows of threads, TC = BN/TN columns (as fa2_simt).
FT_HD constexpr int fa1_simt_tr(int BM, int TM) { return BM / TM; }
FT_HD constexpr int fa1_simt_tc(int BN, int TN) { return BN / TN; }
FT_HD constexpr int fa1_simt_threads(int BM, int BN, int TM, int TN) {
  return fa1_simt_tr(BM, TM) * fa1_simt_tc(BN, TN);
}
// Row strides in floats: 4 floats of padding keep 16-byte shared-memory reads conflict free.
FT_HD constexpr int fa1_simt_row_stride(int D) { return D + 4; }
FT_HD constexpr int fa1_simt_p_stride(int BN) { return BN + 4; }
// Ks[BN][D+4] + Vs[BN][D+4] + Ps[BM][BN+4] + Q_STAGES x Qs[BM][D+4], fp32.
FT_HD constexpr int fa1_simt_smem_bytes(int D, int BM, int BN, int Q_STAGES) {
  return 4 * (2 * BN * (D + 4) + BM * (BN + 4) + Q_STAGES * BM * (D + 4));
}
// Grid: x = query-block groups of one (batch, head) (Q_SPLIT, at most one per query block),
// y = heads, z = batch. Q_SPLIT = 1 is FlashAttention-1's grid: one CTA per (batch, head).
FT_HD constexpr GridDims fa1_simt_grid(int batch, int heads, int seq_q, int BM, int Q_SPLIT) {
  const int q_blocks = ceil_div(seq_q, BM);
  return GridDims{q_blocks < Q_SPLIT ? q_blocks : Q_SPLIT, heads, batch};
}
// Workspace: the running row max m and row sum l, (B, H, Sq) floats each (m first).
FT_HD constexpr long long fa1_simt_workspace_floats(int batch, int heads, int seq_q) {
  return 2LL * batch * heads * seq_q;
}
// Registers of the per-thread accumulators (S tile + O tile), a rough pressure measure.
FT_HD constexpr int fa1_simt_acc_regs(int D, int BN, int TM, int TN) {
  return TM * TN + TM * (D / fa1_simt_tc(BN, TN));
}

// Individual validity conditions (shared by fa1_simt_check and the traits' static_asserts).
FT_HD constexpr bool fa1_simt_d_ok(int D) { return D == 32 || D == 64 || D == 96 || D == 128; }
FT_HD constexpr bool fa1_simt_tiles_ok(int BM, int BN, int TM, int TN) {
  return BM > 0 && BN > 0 && TM > 0 && TN > 0 && BM % TM == 0 && BN % TN == 0;
}
FT_HD constexpr bool fa1_simt_tc_ok(int BN, int TN) { return 32 % fa1_simt_tc(BN, TN) == 0; }
FT_HD constexpr bool fa1_simt_threads_mult32(int BM, int BN, int TM, int TN) {
  return fa1_simt_threads(BM, BN, TM, TN) % 32 == 0;
}
FT_HD constexpr bool fa1_simt_threads_range(int BM, int BN, int TM, int TN) {
  return fa1_simt_threads(BM, BN, TM, TN) >= 64 && fa1_simt_threads(BM, BN, TM, TN) <= 512;
}
FT_HD constexpr bool fa1_simt_dtc_ok(int D, int BN, int TN) { return D % (4 * fa1_simt_tc(BN, TN)) == 0; }
FT_HD constexpr bool fa1_simt_bn4_ok(int BN) { return BN % 4 == 0; }
FT_HD constexpr bool fa1_simt_tile_regs_ok(int TM, int TN) { return TM * TN <= 64; }
FT_HD constexpr bool fa1_simt_acc_regs_ok(int D, int BN, int TM, int TN) {
  return fa1_simt_acc_regs(D, BN, TM, TN) <= 128;
}
FT_HD constexpr bool fa1_simt_stages_ok(int Q_STAGES) { return Q_STAGES == 1 || Q_STAGES == 2; }
FT_HD constexpr bool fa1_simt_split_ok(int Q_SPLIT) { return Q_SPLIT >= 1 && Q_SPLIT <= 64; }

// nullptr if the combination is valid, else the reason. max_smem_bytes: the target's opt-in
// limit (kMaxSmemBytesSm90 default; pass kMaxSmemBytesSm80 for sm_80).
FT_HD constexpr const char* fa1_simt_check(int D, int BM, int BN, int TM, int TN, int Q_STAGES, int Q_SPLIT,
                                           int max_smem_bytes = kMaxSmemBytesSm90) {
  return !fa1_simt_d_ok(D)                           ? "D must be 32, 64, 96 or 128"
         : !fa1_simt_tiles_ok(BM, BN, TM, TN)        ? "BM % TM != 0 or BN % TN != 0"
         : !fa1_simt_stages_ok(Q_STAGES)             ? "Q_STAGES must be 1 or 2"
         : !fa1_simt_split_ok(Q_SPLIT)               ? "Q_SPLIT outside 1..64"
         : !fa1_simt_tc_ok(BN, TN)                   ? "TC does not divide 32"
         : !fa1_simt_threads_mult32(BM, BN, TM, TN)  ? "threads not a multiple of 32"
         : !fa1_simt_threads_range(BM, BN, TM, TN)   ? "threads outside 64..512"
         : !fa1_simt_dtc_ok(D, BN, TN)               ? "D % (4*TC) != 0"
         : !fa1_simt_bn4_ok(BN)                      ? "BN % 4 != 0"
         : !fa1_simt_tile_regs_ok(TM, TN)            ? "TM*TN register tile too large (> 64)"
         : !fa1_simt_acc_regs_ok(D, BN, TM, TN)      ? "TM*(TN + D/TC) accumulators too large (> 128)"
         : fa1_simt_smem_bytes(D, BM, BN, Q_STAGES) > max_smem_bytes ? "shared memory exceeds the limit"
                                                                      : nullptr;
}

template <int D, int BLOCK_M, int BLOCK_N, int TM, int TN, int Q_STAGES, int Q_SPLIT, bool CAUSAL>
struct Fa1SimtTraits {
  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kTM = TM;
  static constexpr int kTN = TN;
  static constexpr int kQStages = Q_STAGES;
  static constexpr int kQSplit = Q_SPLIT;
  static constexpr bool kCausal = CAUSAL;

  static_assert(fa1_simt_d_ok(D), "D must be 32, 64, 96 or 128");
  static_assert(fa1_simt_tiles_ok(BLOCK_M, BLOCK_N, TM, TN), "BM % TM != 0 or BN % TN != 0");
  static_assert(fa1_simt_stages_ok(Q_STAGES), "Q_STAGES must be 1 or 2");
  static_assert(fa1_simt_split_ok(Q_SPLIT), "Q_SPLIT outside 1..64");
  static_assert(fa1_simt_tc_ok(BLOCK_N, TN), "TC does not divide 32");
  static_assert(fa1_simt_threads_mult32(BLOCK_M, BLOCK_N, TM, TN), "threads not a multiple of 32");
  static_assert(fa1_simt_threads_range(BLOCK_M, BLOCK_N, TM, TN), "threads outside 64..512");
  static_assert(fa1_simt_dtc_ok(D, BLOCK_N, TN), "D % (4*TC) != 0");
  static_assert(fa1_simt_bn4_ok(BLOCK_N), "BN % 4 != 0");
  static_assert(fa1_simt_tile_regs_ok(TM, TN), "TM*TN register tile too large (> 64)");
  static_assert(fa1_simt_acc_regs_ok(D, BLOCK_N, TM, TN), "TM*(TN + D/TC) accumulators too large (> 128)");
  // No shared-memory static_assert: the limit depends on the device (prune on the host with
  // fa1_simt_check(..., max_smem_bytes)).
  static_assert(fa1_simt_check(D, BLOCK_M, BLOCK_N, TM, TN, Q_STAGES, Q_SPLIT, 0x7fffffff) == nullptr,
                "invalid Fa1SimtTraits");

  static constexpr int kTR = fa1_simt_tr(BLOCK_M, TM);
  static constexpr int kTC = fa1_simt_tc(BLOCK_N, TN);
  static constexpr int kThreads = fa1_simt_threads(BLOCK_M, BLOCK_N, TM, TN);
  static constexpr int kRowStride = fa1_simt_row_stride(D);  // Qs, Ks, Vs
  static constexpr int kPStride = fa1_simt_p_stride(BLOCK_N);
  static constexpr int kOChunks = D / (4 * kTC);  // float4 output chunks per owned row
  static constexpr int kSmemBytes = fa1_simt_smem_bytes(D, BLOCK_M, BLOCK_N, Q_STAGES);
};

}  // namespace flashtune
