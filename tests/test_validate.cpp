#include <gtest/gtest.h>

#include <cmath>

#include "tuner/compile.hpp"
#include "tuner/validate.hpp"

using namespace flashtune;

TEST(Validate, ToleranceRuleAndStats) {
  Tolerance tol{1e-5, 1e-4};
  ErrorStats e;
  e.add(0, 1.00005f, 1.0, tol);  // 5e-5 <= 1e-5 + 1e-4
  e.add(1, 0.0f, 0.0, tol);
  EXPECT_EQ(e.bad, 0u);
  EXPECT_NEAR(e.max_abs, 5e-5, 1e-7);  // 1.00005f is not exact
  e.add(2, 1.001f, 1.0, tol);
  EXPECT_EQ(e.bad, 1u);
  EXPECT_NE(e.first_bad.find("[2]"), std::string::npos);
  EXPECT_EQ(e.count, 3u);
}

TEST(Validate, NonFiniteHandling) {
  Tolerance tol = tolerance_for(DType::fp32);
  ErrorStats e;
  e.add(0, INFINITY, INFINITY, tol);  // fully masked row's LSE
  EXPECT_EQ(e.bad, 0u);
  e.add(1, NAN, 1.0, tol);  // poison left in place: unwritten output
  EXPECT_EQ(e.bad, 1u);
  e.add(2, 1.0f, INFINITY, tol);
  EXPECT_EQ(e.bad, 2u);
}

TEST(Validate, TolerancesTightenWithPrecision) {
  EXPECT_LT(tolerance_for(DType::fp32).atol, tolerance_for(DType::fp16).atol);
  EXPECT_LE(tolerance_for(DType::fp16).rtol, tolerance_for(DType::bf16).rtol);
}

TEST(Compile, ParsesPtxasLog) {
  const char* log =
      "ptxas info    : Compiling entry function '_Z1k' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z1k\n"
      "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 4096 bytes smem\n";
  Resources r = parse_ptxas_log(log);
  EXPECT_EQ(r.registers, 168);
  EXPECT_EQ(r.smem_static, 4096);
  EXPECT_EQ(r.stack_bytes, 16);
  EXPECT_EQ(r.spill_stores, 8);
  EXPECT_EQ(r.spill_loads, 12);
}

TEST(Compile, ArchLimits) {
  EXPECT_EQ(arch_limits("sm_90").max_smem_per_block, 232448);
  EXPECT_EQ(arch_limits("sm_80").max_smem_per_block, 166912);
  EXPECT_THROW(arch_limits("sm_1"), std::exception);
}
