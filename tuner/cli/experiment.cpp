// flashtune experiment: every implementation of an experiment on its problems.
#include "tuner/cli/verbs.hpp"

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/experiments/experiment.hpp"
#include "tuner/sweep/sweep.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_experiment(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune experiment <experiment.json> [--db PATH] [--dry-run] [--device N] [--timeout S]\n"
              "                            [--seed N] [--python PY]\n"
              "Runs an experiment definition (experiments/*.json) on this GPU: the spaces it lists are tuned\n"
              "on its problems, matmul and copy peaks are probed, then every implementation runs on every\n"
              "problem it supports -- our families with the stored tuned config (or ':default'), the cuBLAS\n"
              "unfused baseline, and the Python baselines (torch SDPA backends, PyTorch CPU, Triton) -- each\n"
              "validated against the float64 reference and timed; one row per (implementation, problem) in\n"
              "--db (default flashtune.db). --dry-run validates the file and lists the rows without a GPU.\n"
              "Then `flashtune report --gpu SLUG` draws it.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "device", "timeout", "seed", "python"}, {"dry-run", "quiet"});
  if (a.positional.size() != 1) throw UsageError("experiment takes one experiment file");
  require_file(a.positional[0], "experiment file");
  ExperimentSpec spec = load_experiment(a.positional[0]);
  if (a.has("dry-run")) {
    auto plan = experiment_plan(spec);
    for (const auto& [impl, p] : plan) std::printf("%-20s %s\n", impl.c_str(), p.str().c_str());
    std::printf("%s: %zu problems, %zu implementations, %zu rows, %zu spaces to tune\n", spec.name.c_str(),
                spec.problems.size(), spec.impls.size(), plan.size(), spec.tune_spaces.size());
    return 0;
  }
  ExperimentOptions o;
  o.run = run_options(a);
  if (!a.has("timeout")) o.run.timeout_s = 120;  // slow baselines on large shapes
  o.python = a.get("python", "python3");
  o.source_dir = data_dir();
  o.progress = !a.has("quiet");
  check_db_path(a.get("db", "flashtune.db"));
  if (is_store_file(a.positional[0], a.get("db", "flashtune.db")))  // the store written over the experiment file
    throw UsageError("'" + a.positional[0] + "' is the --db store (or a file SQLite keeps beside it): give another --db");
  {  // no GPU: one line and exit 2 before any space is compiled or the store is touched
    GpuSession probe(o.run);
    if (!probe.has_gpu())
      throw UsageError("no GPU found (" + probe.no_gpu_reason() + "): an experiment measures on a GPU (--dry-run lists it)");
  }
  Store store(a.get("db", "flashtune.db"));
  long long run = run_experiment(spec, store, o);
  std::map<std::string, int> n;
  for (const auto& r : store.experiment_rows(run)) n[r.status]++;
  std::printf("experiment %s: run %lld:", spec.name.c_str(), run);
  for (auto& [s, c] : n) std::printf(" %d %s", c, s.c_str());
  std::printf("  (db %s)\n", store.path().c_str());
  return 0;
}

}  // namespace flashtune::cli
