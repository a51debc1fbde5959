// The worker's inputs: seeded, counter-based numbers (element i of a stream is a function of the stream and
// i alone, so inputs are reproducible from (problem, seed) whatever the thread count), rounded to the
// kernel's dtype; or a folder's files as they are. Pure host code (gpu_runner.cpp uploads them; tests and
// bench_validate call it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/input_files.hpp"
#include "core/problem.hpp"

namespace flashtune {

uint64_t splitmix64(uint64_t x);

// Standard normal number i of stream `seed` (Box-Muller on two counter-based uniforms).
double normal_at(uint64_t seed, uint64_t i);

// Heavy-tailed inputs: Student-t with 3 degrees of freedom, Z / sqrt(chi2_3 / 3), from counter-based
// normals (Z from the tensor's stream, the three chi-square terms from a stream derived from it),
// clamped to +-kHeavyClamp before scaling: |x| <= 32 * scale (<= 32000 at the largest scale) stays
// finite in fp16; the clamp moves about 1 value in 10^5 (P(|t_3| > 32) ~ 1e-5). Normal numbers need
// no clamp: Box-Muller's largest is sqrt(-2 ln 2^-54) < 8.7.
inline constexpr double kHeavyClamp = 32;
double heavy_at(uint64_t seed, uint64_t i);

// One input tensor: its values as floats (what the reference reads) and its device bytes (what the
// kernel reads), the same numbers.
struct HostTensor {
  std::vector<float> values;
  std::vector<uint8_t> bytes;
};

// n seeded numbers of the distribution, element i = dist.scale * (normal_at or heavy_at)(stream, i) as a
// float, rounded to the dtype (the reference reads the rounded ones): to_device_format's numbers. Made in
// contiguous chunks on up to `threads` threads (0: every core).
HostTensor generated_input(size_t n, uint64_t stream, DType, const InputDist&, int threads = 0);

// dO of a backward: the same kind of distribution, unscaled. The scale stands for the size of
// activations (q, k, v); the gradient arriving from the loss has its own, and dO x30 with V x30 would
// push fp16's dK past its range on heavy-tailed data. baselines.py does the same.
inline InputDist grad_dist(const InputDist& d) { return InputDist{d.kind, 1.0}; }

// DIR/<name>.bin as it is: its bytes go to the device unchanged.
HostTensor loaded_input(const std::string& dir, const InputFile&, DType);

}  // namespace flashtune
