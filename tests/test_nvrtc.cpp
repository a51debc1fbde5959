// NVRTC, no GPU needed (label nvrtc, in CI): for every committed space (configs/spaces/*.json,
// discovered) and both archs, a covering sample (tuner/space/sample.hpp) compiles or is pruned with a stated
// reason; every family's default compiles without spills everywhere it runs; spills and the traits'
// static_asserts reach the user as reasons. Every variant of every space: test_nvrtc_full.cpp
// (label nvrtc_full, run on the GPU machine's cores).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "templates/fa3_wgmma_traits.h"
#include "tests/nvrtc_common.hpp"
#include "tuner/space/sample.hpp"

using namespace flashtune;
using namespace flashtune::test;

class SpaceSample : public ::testing::TestWithParam<SpaceArch> {};

TEST_P(SpaceSample, CompilesOrPrunesWithReason) {
  const auto& [name, arch] = GetParam();
  Space s = load_space(spaces_dir() + name + ".json");
  Compiler c(arch);
  const auto sample = covering_sample(s, c);
  std::vector<Variant> vs;
  size_t to_nvrtc = 0;
  for (const auto& x : sample) {
    vs.push_back(x.variant);
    to_nvrtc += x.prune_reason.empty();
  }
  const auto kernels = c.compile_all(vs, nullptr);
  std::set<std::string> reasons;
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!sample[i].prune_reason.empty()) {  // the cheap pruning is the compile stage's own
      EXPECT_EQ(kernels[i].status, "pruned") << kernels[i].name_expression;
      EXPECT_EQ(kernels[i].reason, sample[i].prune_reason);
    }
    if (kernels[i].status == "pruned") reasons.insert(reason_kind(kernels[i].reason));
  }
  const auto n = expect_sound(kernels);
  std::printf("%s %s: %zu variants, sample %zu (%zu to NVRTC):%s\n", name.c_str(), arch.c_str(), s.variants().size(),
              sample.size(), to_nvrtc, summary(n).c_str());
  for (const auto& r : reasons) std::printf("  pruned: %s\n", r.c_str());
  if (s.family->hopper_only && arch != "sm_90") {
    expect_all_pruned_for_target(s, c);
  } else {
    EXPECT_GT(n.count("compiled") ? n.at("compiled") : 0, 0) << "a space where nothing compiles tests nothing";
  }
}
INSTANTIATE_TEST_SUITE_P(Committed, SpaceSample,
                         ::testing::Combine(::testing::ValuesIn(committed_spaces()), ::testing::ValuesIn(test_arches())),
                         param_name);

namespace {
std::vector<std::string> family_names() {  // test-only families are never emitted: no fallback to check
  std::vector<std::string> out;
  for (const auto& f : families())
    if (!f.test_only) out.push_back(f.name);
  return out;
}
}  // namespace

class FamilyDefault : public ::testing::TestWithParam<SpaceArch> {};

TEST_P(FamilyDefault, CompilesWithoutSpillsEverywhere) {
  // The default is the fallback of emitted dispatch headers: it must compile (no spills) for every
  // head dim, dtype and mask, not only pass the family's check.
  const auto& [name, arch] = GetParam();
  const Family& f = find_family(name);
  Compiler c(arch);
  const auto variants = default_variants(f);
  const auto kernels = c.compile_all(variants, nullptr);
  for (size_t i = 0; i < kernels.size(); ++i) {
    const KernelRecord& k = kernels[i];
    if (f.hopper_only && arch != "sm_90") {
      EXPECT_EQ(k.status, "pruned") << k.name_expression;
      EXPECT_NE(k.reason.find("sm_90a"), std::string::npos) << k.reason;
    } else if (variants[i].mask) {
      // A mask_mod's registers are its predicate's (here sample_mask_predicate: two tensors, b and h read): it must
      // compile, and may spill at the edge of the default's budget (fa3_wgmma_bwd's one consumer at d 128, 8-16
      // bytes), pruned with the reason as any spilling variant; a tuned config replaces the default there.
      EXPECT_TRUE(k.status == "compiled" || k.reason.rfind("spills: ", 0) == 0)
          << k.name_expression << ": " << k.reason << "\n" << k.log.substr(0, 2000);
    } else {
      EXPECT_EQ(k.status, "compiled") << k.name_expression << ": " << k.reason << "\n" << k.log.substr(0, 2000);
    }
  }
  expect_sound(kernels);
}
INSTANTIATE_TEST_SUITE_P(Registry, FamilyDefault,
                         ::testing::Combine(::testing::ValuesIn(family_names()), ::testing::ValuesIn(test_arches())),
                         param_name);

TEST(Nvrtc, SpillsArePrunedWithTheReason) {
  // Spills are only known after ptxas, so no sample can pick them in advance: variants measured to
  // spill (NVRTC 13.0), one per arch, keep the path tested. If a template change makes one fit, pick
  // another spilling variant from `flashtune compile-check`'s table (the grouped-query loop of
  // fa2_wgmma_bwd made its d = 256 SPLIT 1 one fit; this one spills 240 bytes). The sm_80 one spills 36
  // bytes (72 loaded): fa1_simt's 128 x 32 tile, at 12-24 bytes, once compiled without spills in CI.
  struct Spiller {
    const char *family, *params, *arch;
    int head_dim;
    DType dtype;
  };
  for (const Spiller& x : {Spiller{"fa2_wgmma_bwd", "BLOCK_M=128,BLOCK_N=64,SPLIT=1,STAGES=1,DQ_RED=0,LOAD=0", "sm_90", 192,
                                   DType::bf16},
                           Spiller{"fa2_simt_bwd", "BLOCK_M=64,BLOCK_N=128,TM=8,TN=2,DQ_MODE=0", "sm_80", 64,
                                   DType::fp32}}) {
    const Family& f = find_family(x.family);
    KernelRecord k = Compiler(x.arch).compile(Variant{&f, f.parse_config(x.params), x.head_dim, false, x.dtype});
    SCOPED_TRACE(k.name_expression + " " + x.arch);
    EXPECT_EQ(k.status, "pruned");
    EXPECT_EQ(k.reason.rfind("spills: ", 0), 0u) << k.reason;
    EXPECT_GT(k.res.spill_stores + k.res.stack_bytes, 0);
    EXPECT_TRUE(k.cubin.empty());
  }
}

TEST(Nvrtc, Fa3TwoCtasPerSmKeepsTheLaunchAllocation) {
  // TWO_CTAS 1: the setmaxnreg budgets add up to the launch allocation of __launch_bounds__(threads, 2),
  // so ptxas must give the kernel exactly fa3_wgmma_launch_regs (fewer: setmaxnreg.inc would wait for
  // registers that never free), and the consumers' code must fit its budget without spills.
  const Family& f = find_family("fa3_wgmma");
  struct Case {
    const char* params;
    int head_dim;
    bool causal;
  };
  Compiler c("sm_90");
  for (const Case& x : {Case{"BLOCK_N=128,CONSUMERS=1,STAGES=2,OVERLAP=0,PINGPONG=0,P_SMEM=0,PERSISTENT=0,TWO_CTAS=1", 64, true},
                        Case{"BLOCK_N=80,CONSUMERS=1,STAGES=2,OVERLAP=1,PINGPONG=0,P_SMEM=0,PERSISTENT=1,TWO_CTAS=1", 128, true},
                        Case{"BLOCK_N=64,CONSUMERS=2,STAGES=2,OVERLAP=0,PINGPONG=0,P_SMEM=0,PERSISTENT=1,TWO_CTAS=1", 64, false}}) {
    const Config cfg = f.parse_config(x.params);
    KernelRecord k = c.compile(Variant{&f, cfg, x.head_dim, x.causal, DType::bf16});
    SCOPED_TRACE(k.name_expression);
    ASSERT_EQ(k.status, "compiled") << k.reason;
    EXPECT_EQ(k.res.spill_stores + k.res.spill_loads + k.res.stack_bytes, 0);
    EXPECT_EQ(k.res.registers, fa3_wgmma_launch_regs(cfg[1], 2));
  }
}

TEST(Nvrtc, StaticAssertBecomesTheReason) {
  // Bypass the family's pre-compile check to prove the traits reject the same combination.
  Family f = find_family("fa2_simt");
  f.check = [](const Config&, int) -> const char* { return nullptr; };
  Compiler c("sm_90");
  KernelRecord k = c.compile(Variant{&f, {64, 64, 4, 4, 2}, 96, false, DType::fp32});
  EXPECT_EQ(k.status, "compile_error");
  EXPECT_NE(k.reason.find("D % (4*TC) != 0"), std::string::npos) << k.reason;
}

TEST(Nvrtc, CacheKeyCoversArchAndConfig) {
  const Family& f = find_family("fa2_simt");
  Variant a{&f, {64, 32, 4, 4, 2}, 64, false, DType::fp32};
  Variant b = a;
  b.causal = true;
  Compiler c90("sm_90"), c80("sm_80");
  EXPECT_NE(c90.variant_hash(a), c90.variant_hash(b));
  EXPECT_NE(c90.variant_hash(a), c80.variant_hash(a));
  EXPECT_EQ(c90.variant_hash(a), Compiler("sm_90").variant_hash(a));
}
