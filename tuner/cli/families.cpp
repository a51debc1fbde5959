// flashtune families: the registry's kernel families.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/util.hpp"
#include "tuner/cli/args.hpp"

using nlohmann::json;

namespace flashtune::cli {

namespace {
// The score modifications a family has (Family::mods), by name: ["window", "softcap", "alibi", "mask"].
nlohmann::json mods_list(unsigned mods) {
  nlohmann::json out = nlohmann::json::array();
  if (mods & kModWindow) out.push_back("window");
  if (mods & kModSoftcap) out.push_back("softcap");
  if (mods & kModAlibi) out.push_back("alibi");
  if (mods & kModMask) out.push_back("mask");
  return out;
}
}  // namespace

int cmd_families(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune families [--json]\n"
              "Lists the registry's kernel families: name, direction, dtypes, head dims, tunables with their\n"
              "domains, default config, hopper_only (built for sm_90a, pruned elsewhere), test_only, gqa\n"
              "(grouped-query heads_k), varlen (packed variable-length batches), paged (paged K/V caches),\n"
              "max_seq_q (the query rows per sequence it serves; 0: any). Tests and\n"
              "scripts read --json instead of keeping lists of families.");
    return 0;
  }
  Args a = parse(argc, argv, {}, {"json"});
  if (!a.positional.empty()) throw UsageError("families takes no positional arguments");
  json all = json::array();
  for (const auto& f : families()) {
    json j = {{"name", f.name}, {"direction", f.direction}, {"template", f.template_file},
              {"kernels", f.kernels}, {"head_dims", f.head_dims}, {"hopper_only", f.hopper_only},
              {"test_only", f.test_only}, {"gqa", f.gqa}, {"varlen", f.varlen}, {"paged", f.paged}, {"mods", mods_list(f.mods)}, {"max_seq_q", f.max_seq_q},
              {"default", f.config_string(f.default_config)}};
    j["dtypes"] = json::array();
    for (DType t : f.dtypes) j["dtypes"].push_back(to_string(t));
    j["params"] = json::array();
    j["default_config"] = json::object();
    for (size_t i = 0; i < f.params.size(); ++i) {
      j["params"].push_back({{"name", f.params[i].name}, {"domain", f.params[i].domain}});
      j["default_config"][f.params[i].name] = f.default_config[i];
    }
    all.push_back(std::move(j));
  }
  if (a.has("json")) {
    std::printf("%s\n", all.dump(1).c_str());
    return 0;
  }
  for (const auto& j : all) {
    auto list = [](const json& arr) {
      std::string s;
      for (const auto& v : arr) s += (s.empty() ? "" : ",") + (v.is_string() ? v.get<std::string>() : v.dump());
      return s;
    };
    std::string params;
    for (const auto& p : j["params"]) params += (params.empty() ? "" : " ") + p["name"].get<std::string>() + "{" + list(p["domain"]) + "}";
    const int max_sq = j["max_seq_q"].get<int>();
    std::printf("%-14s %s  dtypes %s  d %s%s%s%s%s%s%s\n  params  %s\n  default %s\n", j["name"].get<std::string>().c_str(),
                j["direction"].get<std::string>().c_str(), list(j["dtypes"]).c_str(), list(j["head_dims"]).c_str(),
                j["gqa"].get<bool>() ? "  gqa" : "", j["varlen"].get<bool>() ? "  varlen" : "",
                j["paged"].get<bool>() ? "  paged" : "", max_sq ? ("  Sq<=" + std::to_string(max_sq)).c_str() : "",
                j["hopper_only"].get<bool>() ? "  hopper_only" : "", j["test_only"].get<bool>() ? "  test_only" : "",
                params.c_str(), j["default"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace flashtune::cli
