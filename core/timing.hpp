// The worker's default timing (gpu_runner.cpp time_repeats): warm-up launches, then about target_ms of
// L2-flushed repeats, at least min_reps and at most max_reps. A request's "timing" object overrides each.
// Shared by the sweep (what a stored row must hold to stand for a full timing), selection (which rows
// may be picked) and replay (what a full timing would have cost).
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace flashtune::timing {

inline constexpr int kWarmup = 3;
inline constexpr int kMinReps = 10;
inline constexpr int kMaxReps = 50;
inline constexpr double kTargetMs = 400.0;

// The repeats a full timing makes of a launch taking `ms`.
inline int default_reps(double ms) { return std::clamp((int)(kTargetMs / std::max(1e-3, ms)), kMinReps, kMaxReps); }

// The one median and spread every stored timing uses: percentile q (0.5 the median, 0.2 and 0.8 the
// spread) of one set of samples, linear between the two nearest ranks (numpy's and torch.quantile's
// default; at 0.5 the mean of the two middle samples of an even count). A median and its p20/p80 always
// come from the same samples, so the median lies within them. 0 for no samples.
template <class T>
double percentile(std::vector<T> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * (double)(v.size() - 1);
  const size_t lo = (size_t)pos, hi = std::min(lo + 1, v.size() - 1);
  return (double)v[lo] + (pos - (double)lo) * ((double)v[hi] - (double)v[lo]);
}

}  // namespace flashtune::timing
