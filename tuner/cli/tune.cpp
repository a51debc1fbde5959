// flashtune tune: the sweep: compile, run, validate, time and store every candidate.
#include "tuner/cli/verbs.hpp"

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "core/mask_mod.hpp"
#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/search/search.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"

using nlohmann::json;

namespace flashtune::cli {

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "0,1,3": device indices, each 0..64, at most 16 of them (an index may repeat: workers sharing a GPU).
std::vector<int> parse_devices(const std::string& text) {
  const std::string bad = "--devices must be a comma-separated list of device indices such as 0,1, got '" +
                          brief(text) + "'";
  std::vector<int> out;
  for (const std::string& part : split(text, ',')) {
    if (part.empty() || part.size() > 2 || part.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(bad);
    const int d = std::stoi(part);
    if (d > 64) throw UsageError(bad);
    out.push_back(d);
  }
  if (out.empty() || out.size() > 16) throw UsageError(bad);
  return out;
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts(
        "usage: flashtune tune <space.json> <problems.json> [--db PATH] [--device N | --devices 0,1,...]\n"
        "                      [--strategy exhaustive|random|halving|guided] [--max-evals N|N%] [--time-budget 10m]\n"
        "                      [--seed N] [--shard k/n] [--replay DB [--replay-device NAME]] [--json]\n"
        "                      [--stop-margin X] [--retime N] [--timeout S] [--arch A] [--quiet] [--worker-threads N]\n"
        "                      [--input-dist normal|heavy] [--input-scale X] [--pause-us N]\n"
        "Searches the space's variants on each problem: a strategy proposes candidates, a worker process per\n"
        "GPU compiles only what is proposed, runs it, validates it against the float64 reference, times the\n"
        "valid ones and stores every attempt (one row each: a stopped sweep resumes from what is stored).\n"
        "Without a GPU it compiles and prunes only. Default --db flashtune.db, --timeout 30 s.\n"
        "  --strategy     exhaustive (default: every candidate), random, halving (every candidate with 2\n"
        "                 repeats, the best quarter with 8, the best 3 with the full timing), guided\n"
        "                 (a space-filling start, then a nearest-neighbour model of the times so far\n"
        "                 proposes the candidate it predicts fastest, less a shrinking exploration bonus)\n"
        "  --max-evals    distinct candidates per problem: a count or a percentage of the problem's\n"
        "                 candidates (after pruning without compiling)\n"
        "  --time-budget  wall time of the whole sweep (replay: simulated GPU timing time), e.g. 90s, 10m, 1h30m;\n"
        "                 each problem, as it starts, gets an equal part of what is left (so every problem\n"
        "                 gets a pick, and what one leaves goes to the next); no evaluation of a problem\n"
        "                 starts after its part\n"
        "  --seed         seeds the strategy (and the inputs); default 20261121\n"
        "  --devices      one worker per listed GPU on one sweep into one store (an index twice: two workers\n"
        "                 on one GPU, which perturbs their timings); the GPUs must share an architecture\n"
        "  --worker-threads  CPU threads of each worker's inputs, reference and validation (1 to 4096);\n"
        "                 default: every core for each worker (a share measured slower: references wait)\n"
        "  --shard k/n    this run takes candidate (variant, problem) pairs whose stable hash % n == k\n"
        "                 (compile-only: variants whose hash % n == k); `flashtune merge` joins the stores\n"
        "  --replay DB    evaluates from DB's stored results instead of a GPU (the family's rows on\n"
        "                 --replay-device, default the device with the most), with seeded noise of the stored\n"
        "                 spread; nothing is written. --json prints per problem space_size, evaluations,\n"
        "                 best_found_tflops and exhaustive_best_tflops (null unless DB holds every candidate)\n"
        "  --stop-margin  stop timing a candidate after 3 repeats when it is slower than (1 + X) x the best so\n"
        "                 far (default 0.25; 0: off)\n"
        "  --retime N     re-time each problem's N fastest interleaved (A B C A B C ...) at the end and store\n"
        "                 both figures (default 3; 0: off)\n"
        "  --pause-us N   leave the GPU idle N microseconds (0 to 100000) before each timed repeat: a heavy kernel's\n"
        "                 back-to-back repeats run under the power cap, a pause times it as a synchronised call\n"
        "                 at a time is (the peers' timer); default 0, back to back; kept in the row's detail\n"
        "--input-dist and --input-scale override every problem's \"inputs\": seeded normal numbers, or\n"
        "Student-t with 3 degrees of freedom (heavy), times the scale (0.001 to 1000); either alone keeps\n"
        "the other from each problem. Default: the problem's own, else normal, 1.");
    return 0;
  }
  Args a = parse(argc, argv,
                 {"db", "device", "devices", "timeout", "seed", "arch", "input-dist", "input-scale", "strategy",
                  "max-evals", "time-budget", "shard", "replay", "replay-device", "stop-margin", "retime",
                  "worker-threads", "pause-us"},
                 {"quiet", "allow-large-space", "json"});
  if (a.positional.size() != 2) throw UsageError("tune takes a space file and a problems file");
  Space space = load_space(a.positional[0], a.has("allow-large-space"));
  std::vector<Problem> problems = load_problems(a.positional[1]);
  for (Problem& p : problems) p.inputs = input_dist_option(a, p.inputs);
  check_mask_mods_compile(problems);  // a predicate NVRTC rejects: one line, before any work
  if (space.mask) check_mask_compiles(*space.mask);
  if (variants_for(space, problems).empty())  // a sweep that would do nothing is an error, before any work
    throw UsageError("no problem in " + a.positional[1] + " matches a variant of " + a.positional[0] +
                     " (head_dim, causal, dtype and direction must agree; heads_k needs a grouped-query family, varlen a "
                     "family that runs packed variable-length batches, Sq within the family's max_seq_q)");
  SearchOptions so;
  so.strategy = a.get("strategy", "exhaustive");
  make_strategy({so.strategy, 0, 1}, {});  // an unknown name fails here, before any work
  so.max_evals = a.get("max-evals");
  if (!so.max_evals.empty()) parse_max_evals(so.max_evals, 100);
  if (a.has("time-budget")) so.time_budget_s = parse_duration(a.get("time-budget"));
  so.seed = (uint64_t)a.get_int("seed", 20261121, 0, (1ll << 62));
  if (a.has("shard")) so.shard = parse_shard(a.get("shard"));
  so.stop_margin = a.get("stop-margin") == "0" ? 0.0 : a.get_double("stop-margin", 0.25, 100);
  so.retime_top = (int)a.get_int("retime", 3, 0, 20);
  so.progress = !a.has("quiet");
  if (a.has("device") && a.has("devices")) throw UsageError("give --device or --devices, not both");

  if (a.has("replay")) {
    const std::string db = a.get("replay");
    check_db_path(db);
    require_file(db, "--replay database");
    if (a.has("db")) throw UsageError("--replay writes nothing: drop --db");
    const auto reports = replay_search(space, problems, db, a.get("replay-device"), so);
    if (a.has("json")) {
      json out = json::array();
      for (const auto& r : reports) out.push_back(r.to_json());
      std::printf("%s\n", out.dump(1).c_str());
      return 0;
    }
    std::printf("%-44s %6s %6s %9s %9s %7s  %s\n", "problem", "space", "evals", "found", "best", "ratio", "config");
    for (const auto& r : reports)
      std::printf("%-44s %6zu %6zu %9.2f %9s %7s  %s\n", r.problem.str().c_str(), r.space_size, r.evaluations,
                  r.best_tflops, r.exhaustive_best_tflops >= 0 ? fixed(r.exhaustive_best_tflops, 2).c_str() : "-",
                  r.exhaustive_best_tflops > 0 ? fixed(r.best_tflops / r.exhaustive_best_tflops, 4).c_str() : "-",
                  r.best_config.c_str());
    return 0;
  }

  check_db_path(a.get("db", "flashtune.db"));
  for (const std::string& in : a.positional)  // the store (or its journal) written over the space or problems file
    if (is_store_file(in, a.get("db", "flashtune.db")))
      throw UsageError("'" + in + "' is the --db store (or a file SQLite keeps beside it): give another --db");
  SweepOptions o;
  o.run = run_options(a);
  if (a.has("worker-threads")) o.run.worker_threads = (int)a.get_int("worker-threads", 0, 1, 4096);
  o.arch = a.get("arch");
  if (!o.arch.empty()) arch_limits(o.arch);
  o.progress = so.progress;
  o.search = so;
  o.devices = a.has("devices") ? parse_devices(a.get("devices")) : std::vector<int>{o.run.device};
  o.json = a.has("json");
  Store store(a.get("db", "flashtune.db"));
  SweepSummary s = tune(space, problems, store, o);
  if (o.json) {
    json out = json::array();
    for (const auto& r : s.reports) out.push_back(r.to_json());
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  std::printf("%s: %s", space.family->name.c_str(), s.ran_kernels ? "candidates" : "variants");
  for (auto& [status, count] : s.by_status) std::printf(" %d %s", count, status.c_str());
  if (s.skipped) std::printf(", %d already stored", s.skipped);
  std::printf("  (db %s)\n", store.path().c_str());
  return 0;
}

}  // namespace flashtune::cli
