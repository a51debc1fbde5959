// flashtune merge: stores (shards, machines) into one.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/interop/merge.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_merge(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune merge A.db B.db ... -o OUT.db [--quiet]\n"
              "Copies the kernels, results and experiment runs of every input store into OUT.db (created if\n"
              "missing; an existing store of ours is merged into, and migrated if older). A row whose key OUT.db\n"
              "already holds is kept as stored. Each input becomes a provenance row of OUT.db (its path, a hash\n"
              "of its rows, the time, the rows it added), and an input whose content was merged before adds\n"
              "nothing: merging twice changes nothing. Inputs are opened read-only, any schema of ours.\n"
              "Refused (exit 2, OUT.db untouched): a file that is not a flashtune store, a newer schema, an input\n"
              "that is OUT.db, a row this build cannot use, and mismatched devices: a device name that two stores\n"
              "hold results for with different (arch, SM count, driver version) sets. One transaction.");
    return 0;
  }
  std::vector<char*> args = with_output_flag(argc, argv);
  Args a = parse(argc, args.data(), {"output"}, {"quiet"});
  if (!a.has("output")) throw UsageError("merge needs -o OUT.db");
  if (a.positional.empty()) throw UsageError("merge needs at least one input store");
  auto summaries = merge_stores(a.positional, a.get("output"));
  long long kernels = 0, results = 0;
  for (const auto& m : summaries) {
    kernels += m.kernels;
    results += m.results;
    if (a.has("quiet")) continue;
    if (m.already) {
      std::printf("%s: already merged (provenance %lld), nothing copied\n", m.path.c_str(), m.provenance_id);
      continue;
    }
    std::printf("%s: +%lld kernels, +%lld results, +%lld experiment runs (+%lld rows)", m.path.c_str(), m.kernels,
                m.results, m.experiment_runs, m.experiment_rows);
    if (m.kernels_present + m.results_present) std::printf(", %lld already stored", m.kernels_present + m.results_present);
    if (m.kernels_differ + m.results_differ)
      std::printf(", %lld kept as stored though the input's values differ", m.kernels_differ + m.results_differ);
    std::printf("\n");
  }
  std::printf("merged %zu stores into %s: +%lld kernels, +%lld results\n", summaries.size(), a.get("output").c_str(),
              kernels, results);
  return 0;
}

}  // namespace flashtune::cli
