// Every variant of every committed space (configs/spaces/*.json, discovered) for sm_80 and sm_90:
// compiled without spills, or pruned with a stated reason; never a compile error. Thousands of NVRTC
// compiles: label nvrtc_full, run by the GPU machine (scripts/device_run.sh tests, scripts/test.sh
// --full-compile), not by CI, which compiles a covering sample (test_nvrtc.cpp).
#include <gtest/gtest.h>

#include "tests/nvrtc_common.hpp"

using namespace flashtune;
using namespace flashtune::test;

class FullSpace : public ::testing::TestWithParam<SpaceArch> {};

TEST_P(FullSpace, EveryVariantCompilesOrPrunesWithReason) {
  const auto& [name, arch] = GetParam();
  Space s = load_space(spaces_dir() + name + ".json");
  Compiler c(arch);
  const auto kernels = c.compile_all(s.variants(), nullptr);
  const auto n = expect_sound(kernels);
  std::printf("%s %s: %zu variants:%s\n", name.c_str(), arch.c_str(), kernels.size(), summary(n).c_str());
  if (s.family->hopper_only && arch != "sm_90") {
    expect_all_pruned_for_target(s, c);
  } else {
    EXPECT_GT(n.count("compiled") ? n.at("compiled") : 0, 0) << "a space where nothing compiles tests nothing";
  }
}
INSTANTIATE_TEST_SUITE_P(Committed, FullSpace,
                         ::testing::Combine(::testing::ValuesIn(committed_spaces()), ::testing::ValuesIn(test_arches())),
                         param_name);
