// flashtune emit: per-GPU best-config headers plus dispatch.hpp.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/emit.hpp"
#include "results/select.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"

using nlohmann::json;

namespace flashtune::cli {

namespace {

std::string command_line(int argc, char** argv) {
  std::string s = "flashtune";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

}  // namespace

int cmd_emit(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune emit --db PATH --out DIR [--family F]\n"
              "Writes DIR/<arch>_<gpu>.hpp per device in the store and DIR/dispatch.hpp (fallback device ->\n"
              "arch -> default); a backward bucket also gets the best of its bitwise-reproducible configs as a\n"
              "deterministic entry; a decoding family's buckets are per (batch x kv heads, sequence). Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "out", "family"}, {});
  no_positional(a, "emit");
  if (!a.has("db") || !a.has("out")) throw UsageError("emit needs --db and --out");
  Store store(a.get("db"), Store::Mode::read_only);
  ResultFilter filter = filter_from(a);  // every status, as best's
  filter.lean = true;                    // only what selection reads (ReadBudget bounds the read)
  const std::vector<ResultRecord> rows = store.results(filter);
  auto choices = best_per_bucket(rows);
  for (auto& c : best_per_bucket(rows, true))  // the deterministic backward's picks, entries of their own
    if (c.direction == "bwd") choices.push_back(std::move(c));
  auto res = emit_headers(choices, a.get("out"), command_line(argc, argv), {a.get("db")});
  for (const auto& w : res.written) std::printf("wrote %s\n", w.c_str());
  std::printf("%d entries\n", res.entries);
  return 0;
}

}  // namespace flashtune::cli
