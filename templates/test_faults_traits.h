// Traits of the test-only `fault` family (test_faults.cuh). Host-usable, no device code.
#pragma once
#include "traits_common.h"

namespace flashtune {

inline constexpr int kFaultThreads = 64;
inline constexpr int kFaultSkippedKeys = 64;     // MODE 3: keys [0, 64), one K/V block, are skipped
inline constexpr float kFaultRowShift = 0.05f;  // MODE 4: one row moved by 5% of its magnitude scale

// MODE 0: correct attention, one thread per query row (the control);
// MODE 1: writes far out of bounds (illegal address); MODE 2: never terminates;
// MODE 3: skips one K/V block; MODE 4: perturbs one output row (slightly wrong: must be `invalid`).
// DTYPE: 0 fp32, 1 fp16, 2 bf16 (inputs and O; arithmetic in fp32).
template <int MODE, int D, bool CAUSAL, int DTYPE = 0>
struct FaultTraits {
  static constexpr int kMode = MODE;
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr int kDtype = DTYPE;
  static constexpr int kThreads = kFaultThreads;
  static constexpr int kSmemBytes = 0;
  static_assert(MODE >= 0 && MODE <= 4,
                "MODE must be 0 (ok), 1 (out-of-bounds write), 2 (hang), 3 (skips a K/V block) or 4 (perturbs a row)");
  static_assert(DTYPE >= 0 && DTYPE <= 2, "DTYPE must be 0 (fp32), 1 (fp16) or 2 (bf16)");
};

FT_HD constexpr GridDims fault_grid(int batch, int heads, int seq_q) {
  return GridDims{ceil_div(seq_q, kFaultThreads), heads, batch};
}

}  // namespace flashtune
