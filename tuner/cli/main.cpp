// flashtune: the command line. Each verb validates its arguments and fails with one line
// and exit code 2 on bad input; stored results are never touched by a failing command.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "tuner/cli/verbs.hpp"

using namespace flashtune;

namespace {

constexpr const char* kUsage = R"(usage: flashtune <command> [options]

commands:
  devices                               list CUDA devices (through the worker)
  families [--json]                     the kernel families: direction, dtypes, head dims, tunables, default
  problems <problems.json> [--json]     a problem set as flashtune reads it (varlen: the lengths), FLOPs
  compile-check <space.json> [--arch sm_90]
                                        compile (or prune, with the reason) every variant of a space
  tune <space.json> <problems.json> [--db PATH] [--device N] [--timeout S] [--seed N] [--arch A]
      [--input-dist normal|heavy] [--input-scale X]
                                        sweep: compile, run, validate, time and store every candidate
  run --family F (--params K=V,... | --best) --shape B,H,Sq,Sk,d [--dtype fp32] [--causal]
      [--direction fwd|bwd] [--seed N] [--check] [--check-determinism] [--json] [--db PATH] [--device N]
      [--inputs DIR] [--save-outputs DIR] [--input-dist normal|heavy] [--input-scale X] [--heads-k N]
      (varlen: --shape H,d with --varlen FILE|JSON or --seq-lens L,.. [--seq-lens-k L,..])
                                        one config on one problem, validated, timed
  best --db PATH [--family F] [--device NAME] [--dtype T] [--d N] [--causal 0|1] [--csv]
                                        the best valid config per problem, with TFLOP/s
  emit --db PATH --out DIR              per-GPU best-config headers plus dispatch.hpp
  experiment <experiment.json> [--db PATH] [--dry-run] [--device N] [--timeout S] [--seed N]
                                        every implementation of an experiment on its problems, stored
  report --db PATH [--out DIR]          REPORT.md, CSVs and plots from a store (--gpu SLUG: reports/SLUG/results.db)
  drop-cubins --db PATH                 strip compiled binaries from a store (for committing it)
  merge A.db B.db ... -o OUT.db         stores (shards, machines) into one; the same input twice adds nothing
  export --db PATH [--format t4] [-o FILE]
                                        results in the T4 auto-tuning format (Kernel Tuner, KTT)
  import --db PATH FILE.json            a T4 file exported by flashtune into a store

every command takes --help.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string verb = argv[1];
  // The registry: each verb's function, in its own file (tuner/cli/<verb>.cpp, declared in verbs.hpp).
  static const std::map<std::string, int (*)(int, char**)> verbs = {
      {"devices", cli::cmd_devices},       {"families", cli::cmd_families},
      {"problems", cli::cmd_problems},     {"compile-check", cli::cmd_compile_check},
      {"tune", cli::cmd_tune},             {"run", cli::cmd_run},
      {"best", cli::cmd_best},             {"emit", cli::cmd_emit},
      {"experiment", cli::cmd_experiment}, {"report", cli::cmd_report},
      {"drop-cubins", cli::cmd_drop_cubins}, {"merge", cli::cmd_merge},
      {"export", cli::cmd_export},         {"import", cli::cmd_import}};
  auto it = verbs.find(verb);
  try {
    if (it == verbs.end()) throw UsageError("unknown command '" + verb + "' (see flashtune --help)");
    return it->second(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashtune: %s\n", brief(e.what(), 400).c_str());
    return 2;
  } catch (const nlohmann::json::exception& e) {  // JSON the CLI read that had the wrong shape: bad input
    std::fprintf(stderr, "flashtune: bad JSON input: %s\n", brief(e.what(), 200).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashtune: error: %s\n", brief(e.what(), 400).c_str());
    return 1;
  }
}
