// Search strategies: which candidates of one problem to evaluate next, and with how many timing repeats.
// A sweep is candidates -> strategy.propose -> an evaluator (GPU or replay) -> strategy.observe, until
// the strategy is done or a budget ends it. Strategies see only what a GPU-less machine knows about a
// candidate (its tunables, its shared memory and threads) and what evaluations returned; nothing here
// touches a GPU, a compiler or a store, so every strategy is tested on replayed sweeps.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashtune {

// A candidate as a strategy sees it: features scaled to [0, 1] (each tunable's log2 over the space's
// values, then static features such as log2 shared memory and threads per block).
struct CandidateFeatures {
  std::vector<double> x;
};

// What one evaluation returned.
struct Outcome {
  bool ok = false;          // validated and timed
  double ms = 0;            // median of the repeats (ok only)
  int reps = 0;             // timed repeats
  bool early_stopped = false;  // timing stopped after a few repeats: clearly slower than the best so far
};

// One evaluation to make: candidate index, timing repeats (0: the worker's adaptive default), and
// warm-up launches (-1: default).
struct Proposal {
  size_t candidate = 0;
  int reps = 0;
  int warmup = -1;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Up to `n` evaluations to make next (n >= 1: as many as evaluators are free); empty when done.
  // The same candidate may come back with more repeats (halving).
  virtual std::vector<Proposal> propose(size_t n) = 0;
  virtual void observe(const Proposal&, const Outcome&) = 0;
  // Whether early stopping may cut this proposal's timing (not for re-timings that rank finalists).
  virtual bool may_stop_early(const Proposal&) const { return true; }
};

struct StrategyOptions {
  std::string name = "exhaustive";  // exhaustive | random | halving | guided
  size_t max_evals = 0;             // distinct candidates evaluated; 0: no limit
  uint64_t seed = 1;
};

// About how many evaluations the strategy makes over n candidates (halving's rounds included): the
// progress line's total.
size_t planned_evaluations(const StrategyOptions&, size_t n);
// The strategy names, for help text and errors.
const std::vector<std::string>& strategy_names();
// Throws UsageError for an unknown name.
std::unique_ptr<Strategy> make_strategy(const StrategyOptions&, const std::vector<CandidateFeatures>&);

// "25%" of `space` or "40": a count >= 1; throws UsageError (one line) otherwise.
size_t parse_max_evals(const std::string& text, size_t space);
// "10m", "90s", "1h", "1h30m", "45": seconds > 0; throws UsageError otherwise.
double parse_duration(const std::string& text);

}  // namespace flashtune
