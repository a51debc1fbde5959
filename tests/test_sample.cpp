// The covering sample (tuner/space/sample.hpp) that CI compiles instead of every variant: its cover
// properties, checked independently of how it is built, on a synthetic family and on every committed
// space of the registry. No NVRTC call: only the cheap pruning.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "tuner/space/sample.hpp"

using namespace flashtune;

namespace {

std::string key(const Variant& v) {
  return v.family->name + "|" + v.family->config_string(v.config) + "|" + std::to_string(v.head_dim) + "|" +
         (v.causal ? "c" : "n") + "|" + to_string(v.dtype) + (v.varlen ? "|varlen" : "") + (v.paged ? "|paged" : "") +
         (v.mods ? "|" + mods_string(v.mods) : "");
}

// Each value of each tunable, head dim, dtype and mask ("BLOCK_M=64", "d=96", ...).
std::vector<std::string> values_of(const Variant& v) {
  std::vector<std::string> out;
  for (size_t i = 0; i < v.family->params.size(); ++i)
    out.push_back(v.family->params[i].name + "=" + std::to_string(v.config[i]));
  out.push_back("d=" + std::to_string(v.head_dim));
  out.push_back(std::string("dtype=") + to_string(v.dtype));
  out.push_back(std::string("causal=") + (v.causal ? "1" : "0"));
  return out;
}

std::set<std::string> pairs_of(const Variant& v) {
  std::set<std::string> out;
  for (size_t i = 0; i < v.family->params.size(); ++i)
    out.insert(v.family->params[i].name + "=" + std::to_string(v.config[i]) + "@" + std::to_string(v.head_dim));
  return out;
}

// The cover properties, computed from the whole list and the sample alone.
void expect_cover(const std::vector<Variant>& all, const Compiler& c, const std::vector<SampledVariant>& sample) {
  std::set<std::string> all_keys, reach_values, any_values, reach_pairs, reasons;
  for (const auto& v : all) {
    all_keys.insert(key(v));
    const std::string why = c.prune_before_compile(v);
    for (auto& x : values_of(v)) (why.empty() ? reach_values : any_values).insert(x);
    if (why.empty()) {
      auto p = pairs_of(v);
      reach_pairs.insert(p.begin(), p.end());
    } else {
      reasons.insert(reason_kind(why));
    }
  }
  std::set<std::string> s_keys, s_reach_values, s_values, s_reach_pairs, s_reasons;
  for (const auto& x : sample) {
    EXPECT_TRUE(all_keys.count(key(x.variant))) << key(x.variant) << " is not in the space";
    EXPECT_TRUE(s_keys.insert(key(x.variant)).second) << key(x.variant) << " sampled twice";
    EXPECT_EQ(x.prune_reason, c.prune_before_compile(x.variant));
    EXPECT_FALSE(x.covers.empty()) << key(x.variant) << " covers nothing";
    for (auto& v : values_of(x.variant)) {
      s_values.insert(v);
      if (x.prune_reason.empty()) s_reach_values.insert(v);
    }
    if (x.prune_reason.empty()) {
      auto p = pairs_of(x.variant);
      s_reach_pairs.insert(p.begin(), p.end());
    } else {
      s_reasons.insert(reason_kind(x.prune_reason));
    }
  }
  for (auto& v : reach_values) EXPECT_TRUE(s_reach_values.count(v)) << v << " never reaches NVRTC in the sample";
  for (auto& v : any_values) EXPECT_TRUE(s_values.count(v)) << v << " is missing from the sample";
  for (auto& p : reach_pairs) EXPECT_TRUE(s_reach_pairs.count(p)) << p << " never reaches NVRTC in the sample";
  EXPECT_EQ(s_reasons, reasons) << "every kind of cheap pruning, once";
}

std::vector<std::string> names_of(const std::vector<SampledVariant>& s) {
  std::vector<std::string> out;
  for (const auto& x : s) out.push_back(key(x.variant));
  return out;
}

// A family no template backs (the sampler never compiles): three tunables, check reasons that depend
// on the head dim, shared memory that exceeds sm_80's limit but not sm_90's.
Family synthetic(bool hopper_only) {
  Family f;
  f.name = "synthetic";
  f.direction = "fwd";
  f.params = {{"A", {1, 2, 3, 4}}, {"B", {8, 16, 32}}, {"C", {0, 1}}};
  f.head_dims = {32, 64, 128};
  f.dtypes = {DType::fp16, DType::bf16};
  f.default_config = {1, 8, 0};
  f.hopper_only = hopper_only;
  f.traits = [](const Config&, int, bool, DType) { return std::string("Synthetic<>"); };
  f.check = [](const Config& c, int d) -> const char* {
    if (c[0] * c[1] > 64) return "A*B too large (> 64)";
    if (c[2] == 1 && d < 64) return "C 1 needs d >= 64";
    return nullptr;
  };
  f.launches = [](const Config& c, const Problem& p) {
    Launch l;
    l.threads = 128;
    l.smem_bytes = (unsigned)(c[0] * p.head_dim * 400);  // A = 4, d = 128: 204800 B, over sm_80's limit
    return std::vector<Launch>{l};
  };
  return f;
}

std::vector<Variant> all_variants(const Family& f) {
  std::vector<Variant> out;
  for (int a : f.params[0].domain)
    for (int b : f.params[1].domain)
      for (int cc : f.params[2].domain)
        for (int d : f.head_dims)
          for (bool causal : {false, true})
            for (DType t : f.dtypes) out.push_back(Variant{&f, {a, b, cc}, d, causal, t});
  return out;
}

}  // namespace

TEST(Sample, ReasonKindIgnoresNumbers) {
  EXPECT_EQ(reason_kind("shared memory 204800 B exceeds the sm_80 limit of 166912 B"),
            "shared memory # B exceeds the sm_# limit of # B");
  EXPECT_EQ(reason_kind("C 1 needs d >= 64"), "C # needs d >= #");
}

TEST(Sample, CoversASyntheticFamily) {
  const Family f = synthetic(false);
  const auto all = all_variants(f);
  for (const char* arch : {"sm_80", "sm_90"}) {
    SCOPED_TRACE(arch);
    Compiler c(arch);
    const auto s = covering_sample(all, c);
    expect_cover(all, c, s);
    EXPECT_LT(s.size(), all.size() / 4) << "a cover should be much smaller than the space";
    std::set<std::string> reasons;
    for (const auto& x : s)
      if (!x.prune_reason.empty()) reasons.insert(reason_kind(x.prune_reason));
    const bool smem = reasons.count("shared memory # B exceeds the sm_# limit of # B");
    EXPECT_EQ(smem, std::string(arch) == "sm_80") << "shared memory over the target's limit: sm_80 only";
    EXPECT_TRUE(reasons.count("A*B too large (> #)"));
    EXPECT_TRUE(reasons.count("C # needs d >= #"));
    EXPECT_EQ(names_of(s), names_of(covering_sample(all, c))) << "deterministic";
  }
  // Without the pairs a cover is no larger, and still covers every single value.
  Compiler c("sm_90");
  EXPECT_LE(covering_sample(all, c, SampleOptions{false}).size(), covering_sample(all, c).size());
}

TEST(Sample, HopperOnlyOnSm80IsAllPrunedWithTheReason) {
  const Family f = synthetic(true);
  const auto all = all_variants(f);
  Compiler c("sm_80");
  const auto s = covering_sample(all, c);
  expect_cover(all, c, s);  // every value still shown, by pruned variants
  for (const auto& x : s) EXPECT_NE(x.prune_reason.find("sm_90a"), std::string::npos) << x.prune_reason;
}

TEST(Sample, CoversEveryCommittedSpace) {
  const std::string dir = std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (const auto& file : files)
    for (const char* arch : {"sm_80", "sm_90"}) {
      SCOPED_TRACE(file + " " + arch);
      Space space = load_space(file);
      Compiler c(arch);
      const auto all = space.variants();
      const auto s = covering_sample(all, c);
      expect_cover(all, c, s);
      size_t to_nvrtc = 0, all_to_nvrtc = 0;
      for (const auto& x : s) to_nvrtc += x.prune_reason.empty();
      for (const auto& v : all) all_to_nvrtc += c.prune_before_compile(v).empty();
      std::printf("%s %s: %zu variants (%zu to NVRTC), sample %zu (%zu to NVRTC)\n",
                  std::filesystem::path(file).filename().c_str(), arch, all.size(), all_to_nvrtc, s.size(), to_nvrtc);
    }
}

TEST(Sample, DefaultVariantsSpanHeadDimsMasksDtypes) {
  for (const auto& f : families()) {
    const auto vs = default_variants(f);
    const size_t dense = f.head_dims.size() * 2 * f.dtypes.size();
    const size_t packed = f.varlen ? f.head_dims.size() * 2 : 0;  // one dtype: see default_variants
    // The paged form at every head dim and mask; its token-major pages (paged_nhd) non-causal at every head dim.
    const size_t paged = (f.paged ? f.head_dims.size() * 2 : 0) + (f.paged_nhd ? f.head_dims.size() : 0);
    // Score modifications (fa3_wgmma): all of them at every head dim (up to mods_max_head_dim: fa2_mma_bwd's 128) and
    // mask, each alone at the largest of those head dims.
    const unsigned score = f.mods & ~kModMask;  // a mask_mod's variants need a predicate: counted apart
    const size_t mod_dims = (size_t)std::count_if(f.head_dims.begin(), f.head_dims.end(),
                                                  [&](int d) { return f.has_mods(score, d); });
    size_t mods = score ? mod_dims * 2 + (score == (kModWindow | kModSoftcap | kModAlibi) ? 6 : 0) : 0;
    // mask_mod (sample_mask_predicate): with the softcap and ALiBi it combines with, and alone, at every head dim
    // and mask.
    const unsigned with = kModMask | (f.mods & (kModSoftcap | kModAlibi));
    if (f.mods & kModMask)
      mods += (size_t)std::count_if(f.head_dims.begin(), f.head_dims.end(), [&](int d) { return f.has_mods(with, d); }) *
              2 * (with == kModMask ? 1 : 2);
    for (const auto& v : vs) EXPECT_EQ(v.mask != nullptr, (v.mods & kModMask) != 0) << f.name;
    if (f.name == "fa2_mma_bwd") EXPECT_EQ(mod_dims, 4u);  // 32, 64, 96, 128: not 192, 256
    for (const auto& v : vs) EXPECT_TRUE(f.has_mods(v.mods, v.head_dim)) << f.name << " d " << v.head_dim;
    EXPECT_EQ(vs.size(), dense + packed + paged + mods) << f.name;
    EXPECT_EQ((size_t)std::count_if(vs.begin(), vs.end(), [](const Variant& v) { return v.mods != 0; }), mods) << f.name;
    if (f.name == "fa3_wgmma") {
      EXPECT_GT(mods, 0u);
      for (unsigned m : {kModWindow, kModSoftcap, kModAlibi, kModWindow | kModSoftcap | kModAlibi})
        EXPECT_TRUE(std::any_of(vs.begin(), vs.end(), [&](const Variant& v) { return v.mods == m; })) << m;
    }
    EXPECT_EQ((size_t)std::count_if(vs.begin(), vs.end(), [](const Variant& v) { return v.varlen; }), packed)
        << f.name;
    EXPECT_EQ((size_t)std::count_if(vs.begin(), vs.end(), [](const Variant& v) { return v.paged; }), paged) << f.name;
    for (const auto& v : vs)
      if (v.varlen || v.paged) EXPECT_EQ(v.dtype, f.dtypes.back()) << f.name;
    for (const auto& v : vs) EXPECT_EQ(v.config, f.default_config) << f.name;
  }
}

// The packed variable-length form is another kernel: a space listing it ("varlen": [false, true]) gets
// every value, head dim, dtype and mask compiled in that form too; a space without it, none.
TEST(Sample, PackedFormCoveredWhereTheSpaceListsIt) {
  const Compiler c("sm_90");
  const Space s = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/fa2_mma.json");
  ASSERT_EQ(s.varlen, (std::vector<bool>{false, true}));
  std::set<std::string> covered;
  size_t packed = 0;
  for (const auto& x : covering_sample(s, c)) {
    packed += x.variant.varlen;
    for (const auto& f : x.covers) covered.insert(f);
  }
  EXPECT_GT(packed, 0u);
  for (int d : s.head_dims) EXPECT_TRUE(covered.count("varlen:d=" + std::to_string(d))) << d;
  for (const char* f : {"varlen:dtype=fp16", "varlen:dtype=bf16", "varlen:causal=0", "varlen:causal=1",
                        "varlen:BLOCK_N=32", "varlen:BLOCK_N=128", "varlen:STAGES=3", "varlen:WARPS=8"})
    EXPECT_TRUE(covered.count(f)) << f;
  Space dense = s;
  dense.varlen = {false};
  for (const auto& x : covering_sample(dense, c)) EXPECT_FALSE(x.variant.varlen);
}

// Likewise the paged K/V cache form of decode_splitkv ("paged": [false, true]).
TEST(Sample, PagedFormCoveredWhereTheSpaceListsIt) {
  const Compiler c("sm_90");
  const Space s = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/decode_splitkv.json");
  ASSERT_EQ(s.paged, (std::vector<bool>{false, true}));
  std::set<std::string> covered;
  size_t paged = 0;
  for (const auto& x : covering_sample(s, c)) {
    paged += x.variant.paged;
    EXPECT_FALSE(x.variant.varlen);
    for (const auto& f : x.covers) covered.insert(f);
  }
  EXPECT_GT(paged, 0u);
  for (int d : s.head_dims) EXPECT_TRUE(covered.count("paged:d=" + std::to_string(d))) << d;
  for (const char* f : {"paged:dtype=fp16", "paged:dtype=bf16", "paged:causal=0", "paged:causal=1", "paged:BLOCK_N=32",
                        "paged:BLOCK_N=256", "paged:STAGES=1", "paged:STAGES=2", "paged:WARPS=8", "paged:SPLITS=1"})
    EXPECT_TRUE(covered.count(f)) << f;
  // The token-major pages ("page_layouts": ["hnd", "nhd"]) are kernels of their own: covered likewise.
  ASSERT_EQ(s.page_layouts, (std::vector<PageLayout>{PageLayout::hnd, PageLayout::nhd}));
  for (int d : s.head_dims) EXPECT_TRUE(covered.count("paged-nhd:d=" + std::to_string(d))) << d;
  for (const char* f : {"paged-nhd:BLOCK_N=32", "paged-nhd:BLOCK_N=256", "paged-nhd:STAGES=1", "paged-nhd:STAGES=2",
                        "paged-nhd:WARPS=2", "paged-nhd:WARPS=8"})
    EXPECT_TRUE(covered.count(f)) << f;
  Space dense = s;
  dense.paged = {false};
  for (const auto& x : covering_sample(dense, c)) EXPECT_FALSE(x.variant.paged);
}
