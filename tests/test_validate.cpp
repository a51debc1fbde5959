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

TEST(Compile, MultiKernelLogReportsTheWorst) {
  const char* log =
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 0 barriers\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem\n"
      "ptxas info    : Used 96 registers, used 1 barriers\n";
  Resources r = parse_ptxas_log(log);
  EXPECT_EQ(r.registers, 255);
  EXPECT_EQ(r.spill_stores, 4);
  EXPECT_EQ(r.stack_bytes, 8);
  EXPECT_EQ(r.smem_static, 1024);
}

TEST(Compile, ArchLimits) {
  EXPECT_EQ(arch_limits("sm_90").max_smem_per_block, 232448);
  EXPECT_EQ(arch_limits("sm_80").max_smem_per_block, 166912);
  EXPECT_THROW(arch_limits("sm_1"), std::exception);
}

#include "tuner/dtype_convert.hpp"

TEST(DtypeConvert, RoundToNearestEvenAndBack) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); 1 + 3*2^-9 rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-9f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp16_to_float(float_to_fp16(-2.5f)), -2.5f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 0x1p-11f)), 1.0f);  // tie to even
  EXPECT_TRUE(std::isnan(bf16_to_float((uint16_t)nan_bits(DType::bf16))));
  EXPECT_TRUE(std::isnan(fp16_to_float((uint16_t)nan_bits(DType::fp16))));
  std::vector<float> v = {0.1f, -3.14159f, 1e-3f};
  auto bytes = to_device_format(v, DType::bf16);
  EXPECT_EQ(bytes.size(), 6u);
  auto back = from_device_format(bytes, DType::bf16);
  EXPECT_EQ(back, v) << "the host copy is rounded to exactly what the device holds";
  EXPECT_NEAR(v[1], -3.14159f, 3.14159f * 0x1p-8f);
}
