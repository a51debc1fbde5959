// flashtune best: the best valid config per problem.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/select.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_best(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune best --db PATH [--family F] [--device NAME] [--dtype T] [--d N] [--causal 0|1] [--csv]\n"
              "                      [--deterministic]\n"
              "The fastest valid config per problem, with its time, TFLOP/s and errors; --deterministic: among the\n"
              "configs whose gradients are bitwise reproducible only. Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "family", "device", "dtype", "d", "causal"}, {"csv", "deterministic"});
  no_positional(a, "best");
  if (!a.has("db")) throw UsageError("best needs --db");
  Store store(a.get("db"), Store::Mode::read_only);
  // Every status: a newer prune or failure of a config supersedes its older success (select.cpp).
  ResultFilter filter = filter_from(a);
  filter.lean = true;  // the text columns selection and this table never read stay unread (ReadBudget bounds the rest)
  const bool det = a.has("deterministic");
  auto best = best_per_problem(det ? reproducible_rows(store.results(filter)) : store.results(filter), det);
  if (a.has("csv")) {
    std::puts("device,family,direction,batch,heads,seq_q,seq_k,head_dim,dtype,causal,config,ms_median,ms_p20,ms_p80,"
              "tflops,gbps,max_abs,max_rel,heads_k,varlen,paged");
    // Stored text quoted as CSV quotes a field (inner quotes doubled), control characters as '?'
    // (never an escape sequence on a terminal); varlen and paged empty when dense.
    // (device and config always quoted, others when they hold ',' or '"').
    auto csv = [](const std::string& text, bool always) {
      const std::string safe = brief(text, text.size());
      if (!always && safe.find_first_of(",\"") == std::string::npos) return safe;
      std::string quoted;
      for (char ch : safe) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      return "\"" + quoted + "\"";
    };
    for (const auto& r : best) {
      const Problem& p = r.problem;
      std::printf("%s,%s,%s,%d,%d,%d,%d,%d,%s,%d,%s,%.6f,%.6f,%.6f,%.3f,%.1f,%.3g,%.3g,%d,%s,%s\n", csv(r.device_name, true).c_str(),
                  csv(r.family, false).c_str(), csv(r.direction, false).c_str(), p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim,
                  to_string(p.dtype), (int)p.causal, csv(r.config, true).c_str(), r.ms_median, r.ms_p20, r.ms_p80, r.tflops,
                  r.gbps, r.max_abs, r.max_rel, p.kv_heads(), p.varlen.key().empty() ? "" : csv(p.varlen.key(), true).c_str(),
                  p.paged.key().empty() ? "" : csv(p.paged.key(), true).c_str());
    }
  } else {
    std::printf("%-24s %-9s %-40s %-46s %9s %8s %9s\n", "device", "family", "problem", "config", "ms", "TFLOP/s",
                "max_abs");
    for (const auto& r : best)
      std::printf("%-24s %-9s %-40s %-46s %9.4f %8.2f %9.2g\n", brief(r.device_name.substr(0, 24)).c_str(),
                  brief(r.family).c_str(), brief(r.problem.str(), 200).c_str(), brief(r.config, 200).c_str(), r.ms_median,
                  r.tflops, r.max_abs);
    if (best.empty()) std::puts("(no valid results match)");
  }
  return 0;
}

}  // namespace flashtune::cli
