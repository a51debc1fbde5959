// One sweep as a search: per problem, the candidates (variants that fit it, less those pruned without
// compiling, less other shards') go to a strategy (strategy.hpp) that proposes evaluations; evaluators
// make them, on GPUs (one worker per device, compiling only what is proposed) or from a stored sweep
// (replay); budgets end the search; every GPU evaluation is one stored row, so a stopped sweep leaves
// nothing half-written and a rerun continues from what is stored.
#pragma once
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "results/store.hpp"
#include "tuner/search/strategy.hpp"
#include "tuner/space/space.hpp"

namespace flashtune {

struct Shard {
  int index = 0, count = 1;  // this run takes the candidates whose stable hash % count == index
  bool all() const { return count == 1; }
};
Shard parse_shard(const std::string& text);  // "k/n", 0 <= k < n <= 4096; throws UsageError
// Stable share of a key (a variant hash, or a variant hash and a problem): same on every machine.
bool in_shard(const Shard&, const std::string& key);

struct SearchOptions {
  std::string strategy = "exhaustive";
  std::string max_evals;         // "" (none), "N" or "N%" of each problem's candidates
  double time_budget_s = 0;      // 0: none; GPU: wall time; replay: simulated timing time
  uint64_t seed = 1;
  double stop_margin = 0.25;     // early stop: slower than (1 + margin) x the best so far after a few repeats; <= 0: off
  int retime_top = 3;            // finalists re-timed interleaved (ABAB) per problem; 0: none
  int retime_rounds = 3;
  Shard shard;
  bool progress = true;
};

// One problem's outcome, for --json and the summary.
struct ProblemReport {
  Problem problem;
  size_t space_size = 0;     // candidates after static pruning (and this shard)
  size_t evaluations = 0;    // distinct candidates evaluated (stored ones reused included)
  size_t reused = 0;         // of them, already in the store
  double timing_ms = 0;      // GPU time spent in timed and warm-up launches (replay: simulated)
  std::string best_config;
  double best_ms = 0, best_tflops = 0;        // the pick, as measured (GPU) or as stored (replay)
  double exhaustive_best_tflops = -1;         // replay: the stored best over every candidate; -1: unknown
  double exhaustive_timing_ms = -1;           // replay: what timing every candidate with the worker's repeats costs
  nlohmann::json to_json() const;
};

// Replays a stored sweep: evaluations read the rows of `db` (read-only) for the space's family on one
// device (`device`, or the one with the most rows), matched by config and problem; timings carry
// seeded noise of the stored spread, shrinking with the repeats asked for.
std::vector<ProblemReport> replay_search(const Space&, const std::vector<Problem>&, const std::string& db,
                                         const std::string& device, const SearchOptions&);

// ---- the pieces a GPU sweep (sweep.cpp) shares with replay -------------------------------------
struct SearchCandidate {
  Variant v;
  std::string hash;  // the compiler's variant hash
};
// The space's variants that fit `p`, less those pruned without compiling, those that cannot read its pages
// (Family::paged_check) and other shards' share.
std::vector<SearchCandidate> search_candidates(const Space&, const Problem&, const Compiler&, const Shard&);

struct SearchEvaluation {
  Outcome o;
  double timing_ms = 0;  // GPU time in warm-up and timed launches
  bool reused = false;   // already stored: nothing ran
};
using SearchEvaluate =
    std::function<SearchEvaluation(int worker, size_t candidate, const Proposal&, double stop_above_ms)>;

// One problem's search, stepped by whoever evaluates: take() hands out the strategy's next proposal
// (none while the strategy waits on evaluations in flight, or once it is done or `stopped`),
// complete() brings its evaluation back. Not thread-safe: callers hold one lock around every call.
// A sweep over several GPUs steps several problems at once (sweep.cpp); search_problem steps one.
class ProblemSearch {
 public:
  struct Ticket {
    Proposal prop;
    double stop_above_ms = 0;  // early stop above this time after 3 repeats (0: never)
  };
  ProblemSearch(const std::vector<SearchCandidate>&, const Problem&, const SearchOptions&);
  ~ProblemSearch();
  std::optional<Ticket> take(bool stopped);
  void complete(const Ticket&, const SearchEvaluation&);
  // Nothing left to propose and nothing in flight (known once a take() found nothing with none in flight).
  bool finished() const { return exhausted_ && in_flight_ == 0; }
  // `ranking`: the fully timed successes, fastest first (ms, candidate).
  ProblemReport report(std::vector<std::pair<double, size_t>>* ranking) const;

 private:
  struct Measured {
    Outcome o;
    int weight = -1;  // repeats, the worker's default counting as the most
  };
  const std::vector<SearchCandidate>& cands_;
  const SearchOptions opt_;
  std::vector<CandidateFeatures> features_;  // the strategy keeps a reference
  std::unique_ptr<Strategy> strategy_;
  ProblemReport rep_;
  int in_flight_ = 0;
  bool exhausted_ = false;
  std::set<size_t> evaluated_;
  std::map<size_t, Measured> measured_;
  // The early-stop bars: the fastest fully timed success, and the fastest reproducible one. A reproducible
  // candidate (Family::reproducible) is cut against its own class's best only: it competes for the
  // deterministic pick, which a faster non-reproducible config does not take from it.
  double best_ms_ = std::numeric_limits<double>::infinity();
  double best_reproducible_ms_ = std::numeric_limits<double>::infinity();
  bool reproducible(size_t candidate) const;
};

// One problem's search, evaluated in the caller's thread (replay); each evaluation that could be cut
// short after 3 repeats gets stop_above_ms (0: never). `deadline` (on `clock`, 0: none) ends it before
// a new evaluation starts.
ProblemReport search_problem(const std::vector<SearchCandidate>&, const Problem&, const SearchOptions&,
                             const SearchEvaluate&, double deadline, const std::function<double()>& clock);

// Several problems' searches stepped by `workers` threads (one per GPU): each worker steps its own
// problem first (its inputs and reference are prepared there), then starts the next problem, then
// shares another's evaluations. With one worker: the problems in order, one after the other; with
// several, no worker idles at the end of a problem (a reference being computed, a halving round
// closing, the re-timing) while another problem has work. start(problem, worker) makes a problem's
// search (nullptr: nothing to search); evaluate runs a ticket outside every lock; finish (re-timing,
// report) runs once per problem, on the worker that found it finished.
using StartProblem = std::function<std::unique_ptr<ProblemSearch>(size_t problem, int worker)>;
using EvaluateTicket = std::function<SearchEvaluation(size_t problem, int worker, const ProblemSearch::Ticket&)>;
using FinishProblem = std::function<void(size_t problem, int worker, const ProblemSearch&)>;
// ready(problem, worker): whether the worker can run the problem's evaluations without waiting for its inputs
// and reference (tuner/sweep/prepare_ahead.hpp). Given, a worker whose own problem has nothing for it prefers
// work that waits for nothing: the next problem when ready, else a ready problem's evaluation to share, and
// only then the next problem or another's evaluation that waits. Empty: every problem is ready.
using ReadyProblem = std::function<bool(size_t problem, int worker)>;
void step_problems(size_t problems, int workers, double deadline, const std::function<double()>& clock,
                   const StartProblem&, const EvaluateTicket&, const FinishProblem&, const ReadyProblem& ready = {});

}  // namespace flashtune
