// flashtune problems: a problem set as flashtune reads it.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/problem.hpp"
#include "core/util.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/space/space.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_problems(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune problems <problems.json> [--json]\n"
              "Prints a problem set as flashtune reads it: a line per problem (its name, FLOPs, bytes), or with\n"
              "--json per problem its JSON (the form `run --json` reports) with \"flops\" and \"bytes\" and, for a\n"
              "packed variable-length batch, the lengths its description gives (\"seq_lens_q\", \"seq_lens_k\",\n"
              "\"cu_seqlens_q\", \"cu_seqlens_k\"), for a paged K/V cache each sequence's \"cache_seqlens\" and the\n"
              "pool's \"num_pages\": what scripts that time other implementations on the same\n"
              "problems read instead of re-deriving them. Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {}, {"json"});
  if (a.positional.size() != 1) throw UsageError("problems takes one problems file");
  const std::vector<Problem> problems = load_problems(a.positional[0]);
  json out = json::array();
  for (const Problem& p : problems) {
    json j = to_json(p);
    j["flops"] = p.flops();
    j["bytes"] = p.bytes();
    if (p.varlen.enabled()) {
      j["seq_lens_q"] = p.varlen.seq_lens_q;
      j["seq_lens_k"] = p.varlen.seq_lens_k;
      j["cu_seqlens_q"] = p.varlen.cu_seqlens_q();
      j["cu_seqlens_k"] = p.varlen.cu_seqlens_k();
    }
    if (p.paged.enabled()) {
      const PageTable t = page_table(p.paged, p.batch, p.seq_k);
      j["cache_seqlens"] = t.cache_seqlens;
      j["num_pages"] = t.num_pages;
    }
    if (!a.has("json")) std::printf("%-60s %12.4g FLOP %12.4g B\n", p.str().c_str(), p.flops(), p.bytes());
    out.push_back(std::move(j));
  }
  if (a.has("json")) std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

}  // namespace flashtune::cli
