// The worker's seeded inputs (worker/inputs.hpp): made in parallel chunks with the rounding fused, they are
// element for element the straightforward ones (element i = scale * normal_at or heavy_at, as a float, then
// to_device_format), whatever the thread count: stored results and references depend on them.
#include <gtest/gtest.h>

#include <cstring>

#include "core/dtype_convert.hpp"
#include "worker/inputs.hpp"

using namespace flashtune;

TEST(Inputs, GeneratedAreTheStraightforwardOnes) {
  const size_t n = (size_t{1} << 17) + 123;  // two chunks and a part
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    for (InputDist dist : {InputDist{}, InputDist{InputDist::Kind::normal, 30}, InputDist{InputDist::Kind::heavy, 1},
                           InputDist{InputDist::Kind::heavy, 1000}}) {
      const uint64_t stream = splitmix64(20261121ull ^ 0x51);
      std::vector<float> values(n);
      const bool heavy = dist.kind == InputDist::Kind::heavy;
      for (size_t i = 0; i < n; ++i) values[i] = (float)(dist.scale * (heavy ? heavy_at(stream, i) : normal_at(stream, i)));
      const std::vector<uint8_t> bytes = to_device_format(values, t);  // rounds values too
      for (int threads : {1, 3, 0}) {
        const HostTensor h = generated_input(n, stream, t, dist, threads);
        const std::string what = std::string(to_string(t)) + " " + dist.str() + " on " + std::to_string(threads);
        EXPECT_EQ(h.bytes, bytes) << what;
        ASSERT_EQ(h.values.size(), n);
        EXPECT_EQ(std::memcmp(h.values.data(), values.data(), n * sizeof(float)), 0) << what;
      }
    }
  EXPECT_TRUE(generated_input(0, 1, DType::bf16, InputDist{}).bytes.empty());
}
