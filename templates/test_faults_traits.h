// Traits of the test-only `fault` family (test_faults.cuh). Host-usable, no device code.
#pragma once
#include "traits_common.h"

namespace flashtune {

inline constexpr int kFaultThreads = 64;

// MODE 0: correct attention, one thread per query row (the control);
// MODE 1: writes far out of bounds (illegal address); MODE 2: never terminates.
template <int MODE, int D, bool CAUSAL>
struct FaultTraits {
  static constexpr int kMode = MODE;
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr int kThreads = kFaultThreads;
  static constexpr int kSmemBytes = 0;
  static_assert(MODE >= 0 && MODE <= 2, "MODE must be 0 (ok), 1 (out-of-bounds write) or 2 (hang)");
};

FT_HD constexpr GridDims fault_grid(int batch, int heads, int seq_q) {
  return GridDims{ceil_div(seq_q, kFaultThreads), heads, batch};
}

}  // namespace flashtune
