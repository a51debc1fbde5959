// NVRTC, no GPU needed: every variant of the committed spaces compiles for sm_80 and sm_90
// or is pruned with a stated reason; the traits' static_asserts reach the user as reasons.
#include <gtest/gtest.h>

#include <map>

#include "tuner/compile.hpp"
#include "tuner/space.hpp"

using namespace flashtune;

namespace {
const std::string kSpaces = std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/";

void compile_space(const std::string& file, const std::string& arch) {
  Space s = load_space(kSpaces + file);
  Compiler c(arch);
  auto variants = s.variants();
  auto kernels = c.compile_all(variants, nullptr);
  std::map<std::string, int> n;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto& k = kernels[i];
    n[k.status]++;
    SCOPED_TRACE(k.name_expression);
    EXPECT_NE(k.status, "compile_error") << k.reason << "\n" << k.log.substr(0, 2000);
    if (k.status == "pruned") EXPECT_FALSE(k.reason.empty());
    if (k.status == "compiled") {
      EXPECT_GT(k.res.registers, 0);
      EXPECT_EQ(k.res.spill_stores, 0);
      EXPECT_FALSE(k.cubin.empty());
      EXPECT_FALSE(k.lowered_name.empty());
    }
  }
  std::string summary;
  for (auto& [st, count] : n) summary += " " + std::to_string(count) + " " + st;
  std::printf("%s %s: %zu variants:%s\n", file.c_str(), arch.c_str(), kernels.size(), summary.c_str());
  EXPECT_GT(n["compiled"], 0) << "a space where nothing compiles tests nothing";
}
}  // namespace

TEST(Nvrtc, Fa2SimtSpaceSm90) { compile_space("fa2_simt.json", "sm_90"); }
TEST(Nvrtc, Fa2SimtSpaceSm80) { compile_space("fa2_simt.json", "sm_80"); }
TEST(Nvrtc, Fa1SimtSpaceSm90) { compile_space("fa1_simt.json", "sm_90"); }
TEST(Nvrtc, Fa1SimtSpaceSm80) { compile_space("fa1_simt.json", "sm_80"); }
TEST(Nvrtc, Fa2MmaSpaceSm90) { compile_space("fa2_mma.json", "sm_90"); }
TEST(Nvrtc, Fa2MmaSpaceSm80) { compile_space("fa2_mma.json", "sm_80"); }
TEST(Nvrtc, Fa2SimtBwdSpaceSm90) { compile_space("fa2_simt_bwd.json", "sm_90"); }
TEST(Nvrtc, Fa2SimtBwdSpaceSm80) { compile_space("fa2_simt_bwd.json", "sm_80"); }
TEST(Nvrtc, Fa2MmaBwdSpaceSm90) { compile_space("fa2_mma_bwd.json", "sm_90"); }
TEST(Nvrtc, Fa2MmaBwdSpaceSm80) { compile_space("fa2_mma_bwd.json", "sm_80"); }
TEST(Nvrtc, Fa2MmaBwdWideSpaceSm90) { compile_space("fa2_mma_bwd_wide.json", "sm_90"); }
TEST(Nvrtc, Fa2MmaBwdWideSpaceSm80) { compile_space("fa2_mma_bwd_wide.json", "sm_80"); }
TEST(Nvrtc, Fa2WgmmaBwdSpaceSm90) { compile_space("fa2_wgmma_bwd.json", "sm_90"); }
TEST(Nvrtc, Fa2WgmmaBwdGridSpaceSm90) { compile_space("fa2_wgmma_bwd_grid.json", "sm_90"); }
TEST(Nvrtc, Fa2WgmmaBwdDefaultCompilesEverywhereSm90) {
  // The default is the fallback of emitted dispatch headers: it must compile (no spills) for every
  // head dim, dtype and mask, not only pass the family's check.
  const Family& f = find_family("fa2_wgmma_bwd");
  Compiler c("sm_90");
  std::vector<Variant> vs;
  for (int d : f.head_dims)
    for (bool causal : {false, true})
      for (DType t : f.dtypes) vs.push_back(Variant{&f, f.default_config, d, causal, t});
  for (const auto& k : c.compile_all(vs, nullptr)) EXPECT_EQ(k.status, "compiled") << k.name_expression << ": " << k.reason;
}
TEST(Nvrtc, Fa2WgmmaBwdPrunedOnSm80) {
  // wgmma is Hopper-only: on sm_80 every variant is pruned before NVRTC, with the reason.
  Space s = load_space(kSpaces + "fa2_wgmma_bwd.json");
  Compiler c("sm_80");
  for (const auto& k : c.compile_all(s.variants(), nullptr)) {
    EXPECT_EQ(k.status, "pruned") << k.name_expression;
    EXPECT_NE(k.reason.find("sm_90a"), std::string::npos) << k.reason;
  }
}
TEST(Nvrtc, NaiveSpaceSm90) { compile_space("naive.json", "sm_90"); }
TEST(Nvrtc, NaiveSpaceSm80) { compile_space("naive.json", "sm_80"); }
TEST(Nvrtc, FaultSpaceSm90) { compile_space("fault.json", "sm_90"); }

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
