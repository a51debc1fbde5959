// The worker's default timing (gpu_runner.cpp time_repeats): warm-up launches, then about target_ms of
// L2-flushed repeats, at least min_reps and at most max_reps. A request's "timing" object overrides each.
// Shared by the sweep (what a stored row must hold to stand for a full timing), selection (which rows
// may be picked) and replay (what a full timing would have cost).
#pragma once
#include <algorithm>

namespace flashtune::timing {

inline constexpr int kWarmup = 3;
inline constexpr int kMinReps = 10;
inline constexpr int kMaxReps = 50;
inline constexpr double kTargetMs = 400.0;

// The repeats a full timing makes of a launch taking `ms`.
inline int default_reps(double ms) { return std::clamp((int)(kTargetMs / std::max(1e-3, ms)), kMinReps, kMaxReps); }

}  // namespace flashtune::timing
