// Shared by the NVRTC tests: the committed spaces as test parameters (discovered, never listed by
// hand) and what every compile record must satisfy.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/compile.hpp"
#include "tuner/space/space.hpp"

namespace flashtune::test {

inline std::string spaces_dir() { return std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/"; }

// Stems of configs/spaces/*.json, sorted: "fa2_mma" for fa2_mma.json.
inline std::vector<std::string> committed_spaces() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(spaces_dir()))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline const std::vector<std::string>& test_arches() {
  static const std::vector<std::string> a = {"sm_80", "sm_90"};
  return a;
}

using SpaceArch = std::tuple<std::string, std::string>;  // (space or family name, arch)
inline std::string param_name(const ::testing::TestParamInfo<SpaceArch>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  for (char& c : s)
    if (!std::isalnum((unsigned char)c)) c = '_';
  return s;
}

// No compile_error; a pruned record says why; a compiled one has registers, a cubin, a lowered name
// and no spills. Returns the count per status.
inline std::map<std::string, int> expect_sound(const std::vector<KernelRecord>& kernels) {
  std::map<std::string, int> n;
  for (const auto& k : kernels) {
    n[k.status]++;
    SCOPED_TRACE(k.name_expression);
    EXPECT_NE(k.status, "compile_error") << k.reason << "\n" << k.log.substr(0, 2000);
    if (k.status == "pruned") EXPECT_FALSE(k.reason.empty());
    if (k.status == "compiled") {
      EXPECT_GT(k.res.registers, 0);
      EXPECT_EQ(k.res.spill_stores, 0);
      EXPECT_EQ(k.res.spill_loads, 0);
      EXPECT_FALSE(k.cubin.empty());
      EXPECT_FALSE(k.lowered_name.empty());
    }
  }
  return n;
}

inline std::string summary(const std::map<std::string, int>& n) {
  std::string s;
  for (auto& [status, count] : n) s += " " + std::to_string(count) + " " + status;
  return s;
}

// A Hopper-only family on another target: every variant is pruned before NVRTC, with the reason.
inline void expect_all_pruned_for_target(const Space& s, const Compiler& c) {
  for (const auto& v : s.variants()) {
    const std::string why = c.prune_before_compile(v);
    ASSERT_NE(why.find("sm_90a"), std::string::npos) << why;
  }
}

}  // namespace flashtune::test
