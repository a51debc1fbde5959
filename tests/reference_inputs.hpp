// Seeded N(0, scale) inputs for the float64 reference's tests (test_reference*.cpp), one helper for all of them.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace flashtune::test {

inline std::vector<float> random_tensor(int64_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> t((size_t)n);
  for (auto& x : t) x = dist(rng);
  return t;
}

}  // namespace flashtune::test
