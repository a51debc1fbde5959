// Launch geometry of the unfused baseline naive_fwd. Host-usable (no device code).
#pragma once
#include "traits_common.h"

namespace flashtune {

// Scratch: the full score/probability matrix (B, H, Sq, Sk) in fp32.
FT_HD constexpr long long naive_workspace_floats(int B, int H, int Sq, int Sk) {
  return static_cast<long long>(B) * H * Sq * Sk;
}
FT_HD constexpr int naive_threads(int THREADS) { return THREADS; }
// q row (D floats) + one float per warp for block reductions.
FT_HD constexpr int naive_smem_bytes(int D, int THREADS) { return 4 * (D + THREADS / 32); }
// One block per query row.
FT_HD constexpr GridDims naive_grid(int batch, int heads, int seq_q) { return GridDims{seq_q, heads, batch}; }

FT_HD constexpr const char* naive_check(int D, int THREADS) {
  return (D <= 0 || D % 4 != 0)                      ? "D must be a positive multiple of 4"
         : (THREADS % 32 != 0)                       ? "threads not a multiple of 32"
         : (THREADS < 32 || THREADS > 1024)          ? "threads outside 32..1024"
                                                     : nullptr;
}

template <int D, int THREADS, bool CAUSAL>
struct NaiveTraits {
  static constexpr int kHeadDim = D;
  static constexpr int kThreads = naive_threads(THREADS);
  static constexpr bool kCausal = CAUSAL;
  static constexpr int kSmemBytes = naive_smem_bytes(D, THREADS);
  static_assert(D > 0 && D % 4 == 0, "D must be a positive multiple of 4");
  static_assert(THREADS % 32 == 0, "threads not a multiple of 32");
  static_assert(THREADS >= 32 && THREADS <= 1024, "threads outside 32..1024");
  static_assert(naive_check(D, THREADS) == nullptr, "invalid NaiveTraits");
};

}  // namespace flashtune
