// Strategies without a GPU: each proposes what it promises (exhaustive everything once, random a seeded
// share, halving rounds of 2 / 8 / full repeats, guided within its budget), and the CLI parsers refuse
// bad budgets and shards in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/compile.hpp"
#include "core/family.hpp"
#include "core/problem.hpp"
#include "core/timing.hpp"
#include "core/util.hpp"
#include "tuner/search/search.hpp"
#include "tuner/search/strategy.hpp"
#include "tuner/space/space.hpp"
#include "worker/telemetry.hpp"

using namespace flashtune;

namespace {
std::vector<CandidateFeatures> grid(int n) {  // n x n candidates on [0,1]^2
  std::vector<CandidateFeatures> f;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) f.push_back({{i / (n - 1.0), j / (n - 1.0)}});
  return f;
}
// A smooth landscape with its optimum at (0.7, 0.3); time in ms.
double landscape(const CandidateFeatures& c) {
  return 1.0 + 4 * (c.x[0] - 0.7) * (c.x[0] - 0.7) + 4 * (c.x[1] - 0.3) * (c.x[1] - 0.3);
}
// Drives a strategy to its end; returns the proposals made.
std::vector<Proposal> drive(Strategy& s, const std::vector<CandidateFeatures>& f) {
  std::vector<Proposal> all;
  for (int guard = 0; guard < 100000; ++guard) {
    auto next = s.propose(2);
    if (next.empty()) break;
    for (const Proposal& p : next) {
      all.push_back(p);
      s.observe(p, {true, landscape(f[p.candidate]), p.reps, false});
    }
  }
  return all;
}
}  // namespace

TEST(Strategy, ExhaustiveProposesEveryCandidateOnce) {
  auto f = grid(5);
  auto s = make_strategy({"exhaustive", 0, 1}, f);
  auto props = drive(*s, f);
  std::set<size_t> seen;
  for (auto& p : props) {
    EXPECT_TRUE(seen.insert(p.candidate).second);
    EXPECT_EQ(p.reps, 0);
  }
  EXPECT_EQ(seen.size(), f.size());
}

TEST(Strategy, RandomIsASeededShare) {
  auto f = grid(6);
  auto a = drive(*make_strategy({"random", 9, 7}, f), f);
  auto b = drive(*make_strategy({"random", 9, 7}, f), f);
  auto c = drive(*make_strategy({"random", 9, 8}, f), f);
  ASSERT_EQ(a.size(), 9u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].candidate, b[i].candidate);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].candidate != c[i].candidate;
  EXPECT_TRUE(differs);
}

TEST(Strategy, HalvingRanksCheaplyThenTimesTheFinalistsFully) {
  auto f = grid(8);  // 64 candidates: 64 x 2 repeats, 16 x 8, 3 x full
  auto props = drive(*make_strategy({"halving", 0, 1}, f), f);
  std::map<int, int> by_reps;
  for (auto& p : props) by_reps[p.reps]++;
  EXPECT_EQ(by_reps[2], 64);
  EXPECT_EQ(by_reps[8], 16);
  EXPECT_EQ(by_reps[0], 3);
  // The finalists are the three fastest of the landscape.
  std::vector<std::pair<double, size_t>> order;
  for (size_t i = 0; i < f.size(); ++i) order.push_back({landscape(f[i]), i});
  std::sort(order.begin(), order.end());
  std::set<size_t> finalists;
  for (auto& p : props)
    if (p.reps == 0) finalists.insert(p.candidate);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(finalists.count(order[i].second)) << i;
}

// A time budget stops halving's first round where it is: what it measured then is a seeded sample of the whole
// space, not the space's first candidates (one value of its first parameter).
TEST(Strategy, HalvingFirstRoundIsASeededSampleOfTheWholeSpace) {
  auto f = grid(8);  // 64 candidates, the first parameter slowest in the space's order
  auto a = make_strategy({"halving", 0, 5}, f), b = make_strategy({"halving", 0, 5}, f);
  const std::vector<Proposal> first = a->propose(16), again = b->propose(16);
  ASSERT_EQ(first.size(), 16u);
  std::set<size_t> distinct;
  bool ordered = true;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].candidate, again[i].candidate) << i;  // the seed decides it
    distinct.insert(first[i].candidate);
    ordered &= first[i].candidate == i;
  }
  EXPECT_EQ(distinct.size(), 16u);
  EXPECT_FALSE(ordered);
  // The first 16 of 64 in the space's order would be two of the eight values of the first parameter
  std::set<size_t> spread;
  for (const Proposal& p : first) spread.insert(p.candidate / 8);
  EXPECT_GE(spread.size(), 5u);
  // and the whole round is still every candidate once
  auto c = make_strategy({"halving", 0, 5}, f);
  std::set<size_t> round;
  for (const Proposal& p : c->propose(64)) round.insert(p.candidate);
  EXPECT_EQ(round.size(), 64u);
}

TEST(Strategy, GuidedStaysInItsBudgetAndFindsTheOptimumOfASmoothLandscape) {
  auto f = grid(10);
  std::vector<Proposal> props = drive(*make_strategy({"guided", 20, 3}, f), f);
  EXPECT_EQ(props.size(), 20u);
  std::set<size_t> distinct;
  double best = 1e9;
  for (auto& p : props) distinct.insert(p.candidate), best = std::min(best, landscape(f[p.candidate]));
  EXPECT_EQ(distinct.size(), props.size());
  double optimum = 1e9;
  for (auto& c : f) optimum = std::min(optimum, landscape(c));
  EXPECT_LE(best, optimum * 1.02);  // 20 of 100 evaluations
}

TEST(Strategy, UnknownNameIsOneLine) {
  EXPECT_THROW(make_strategy({"annealing", 0, 1}, {}), UsageError);
}

TEST(StrategyParse, MaxEvals) {
  EXPECT_EQ(parse_max_evals("25%", 88), 22u);
  EXPECT_EQ(parse_max_evals("25%", 27), 6u);  // never over the share
  EXPECT_EQ(parse_max_evals("1%", 10), 1u);
  EXPECT_EQ(parse_max_evals("40", 10), 40u);
  for (const char* bad : {"", "0", "-3", "150%", "abc", "2.5", "%", "nan%"})
    EXPECT_THROW(parse_max_evals(bad, 10), UsageError) << bad;
}

TEST(StrategyParse, Durations) {
  EXPECT_DOUBLE_EQ(parse_duration("10m"), 600);
  EXPECT_DOUBLE_EQ(parse_duration("90s"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("45"), 45);
  for (const char* bad : {"", "0", "10x", "m", "1h30", "-5m", "99999h"}) EXPECT_THROW(parse_duration(bad), UsageError) << bad;
}

TEST(Shards, PartitionEveryKeyExactlyOnce) {
  for (const char* bad : {"", "3", "1/0", "2/2", "-1/2", "a/b", "1/5000", "1/2/3"})
    EXPECT_THROW(parse_shard(bad), UsageError) << bad;
  const Shard s3 = parse_shard("2/3");
  EXPECT_EQ(s3.index, 2);
  EXPECT_EQ(s3.count, 3);
  std::vector<int> per(3, 0);
  for (int i = 0; i < 300; ++i) {
    int owners = 0;
    for (int k = 0; k < 3; ++k)
      if (in_shard({k, 3}, "key" + std::to_string(i))) ++owners, ++per[k];
    EXPECT_EQ(owners, 1);
  }
  for (int n : per) EXPECT_GT(n, 60);  // roughly even
}

TEST(Telemetry, ReasonBitsHaveNamesAndAbsentNvmlSaysWhy) {
  EXPECT_EQ(throttle_reason_names(0), std::vector<std::string>{});
  EXPECT_EQ(throttle_reason_names(0x1 | 0x4 | 0x40), (std::vector<std::string>{"gpu_idle", "sw_power_cap", "hw_thermal"}));
  EXPECT_EQ(throttle_reason_names(1ull << 40), std::vector<std::string>{"0x10000000000"});
  // A bus id no device has: NVML (where the driver is installed) does not know it; without NVML, why.
  const auto j = Telemetry("0000:FF:1F.7").sample();
  ASSERT_TRUE(j.contains("unavailable")) << j.dump();
  EXPECT_FALSE(j["unavailable"].get<std::string>().empty());
}

namespace {
// Every (problem, candidate) of fa2_mma's space on four problems, evaluated by fake workers that
// record who ran what; the time of a candidate is a fixed function of its index.
struct Stepped {
  std::vector<std::vector<SearchCandidate>> cands;
  std::vector<Problem> problems;
  std::map<std::pair<size_t, size_t>, int> runs;  // (problem, candidate) -> times run
  std::map<size_t, std::set<int>> workers_of;     // problem -> workers that evaluated it
  std::vector<int> finished_by;                   // problem -> the worker that finished it (-1: none)
  std::vector<ProblemReport> reports;
};
Stepped step_fa2_mma(const std::string& strategy, int workers) {
  const Space space = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/fa2_mma.json");
  const Compiler compiler("sm_90");
  Stepped s;
  for (int d : {64, 128, 64, 256}) {
    Problem p;
    p.batch = 2, p.heads = 4, p.seq_q = p.seq_k = 512, p.head_dim = d, p.dtype = DType::bf16;
    p.causal = s.problems.size() == 2;
    s.problems.push_back(p);
    s.cands.push_back(search_candidates(space, p, compiler, Shard{}));
  }
  s.finished_by.assign(s.problems.size(), -1);
  s.reports.resize(s.problems.size());
  SearchOptions o;
  o.strategy = strategy;
  std::mutex mu;
  step_problems(
      s.problems.size(), workers, 0, [] { return 0.0; },
      [&](size_t pi, int) { return std::make_unique<ProblemSearch>(s.cands[pi], s.problems[pi], o); },
      [&](size_t pi, int w, const ProblemSearch::Ticket& t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard<std::mutex> lock(mu);
        s.runs[{pi, t.prop.candidate}]++;
        s.workers_of[pi].insert(w);
        SearchEvaluation e;
        e.o = {true, 1.0 + 0.01 * (double)((t.prop.candidate * 7 + pi) % 13), t.prop.reps, false};
        return e;
      },
      [&](size_t pi, int w, const ProblemSearch& search) {
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_EQ(s.finished_by[pi], -1) << "problem " << pi << " finished twice";
        s.finished_by[pi] = w;
        s.reports[pi] = search.report(nullptr);
      });
  return s;
}
}  // namespace

TEST(StepProblems, SeveralWorkersRunEveryCandidateOnceAndFinishEveryProblemOnce) {
  const Stepped one = step_fa2_mma("exhaustive", 1), two = step_fa2_mma("exhaustive", 3);
  for (const Stepped* s : {&one, &two}) {
    size_t want = 0;
    for (size_t pi = 0; pi < s->problems.size(); ++pi) {
      want += s->cands[pi].size();
      EXPECT_GE(s->finished_by[pi], 0) << "problem " << pi << " never finished";
      EXPECT_EQ(s->reports[pi].evaluations, s->cands[pi].size());
    }
    ASSERT_EQ(s->runs.size(), want);
    for (const auto& [key, n] : s->runs) EXPECT_EQ(n, 1) << "problem " << key.first << " candidate " << key.second;
  }
  // The same picks whatever the number of workers.
  for (size_t pi = 0; pi < one.problems.size(); ++pi) EXPECT_EQ(one.reports[pi].best_config, two.reports[pi].best_config);
  // Three workers on four problems: more than one worker took part overall.
  std::set<int> all;
  for (const auto& [pi, ws] : two.workers_of) all.insert(ws.begin(), ws.end());
  EXPECT_GT(all.size(), 1u);
}

// With `ready` (a problem's inputs and reference prepared ahead, tuner/sweep/prepare_ahead.hpp), a worker whose
// next problem is not ready shares a ready problem's evaluations instead of waiting, and starts the unready one
// only when nothing else is left: problem 1, never ready, starts once problem 0 has no ticket to give (at most
// the other worker's one in flight); problems still start in order, every candidate runs once, the picks stay.
TEST(StepProblems, AWorkerSharesReadyProblemsBeforeWaitingForAnUnreadyOne) {
  const Space space = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/fa2_mma.json");
  const Compiler compiler("sm_90");
  std::vector<Problem> problems;
  std::vector<std::vector<SearchCandidate>> cands;
  for (int d : {64, 128, 256}) {
    Problem p;
    p.batch = 2, p.heads = 4, p.seq_q = p.seq_k = 512, p.head_dim = d, p.dtype = DType::bf16;
    problems.push_back(p);
    cands.push_back(search_candidates(space, p, compiler, Shard{}));
    ASSERT_GT(cands.back().size(), 4u);
  }
  SearchOptions o;
  o.strategy = "exhaustive";
  for (const bool with_ready : {false, true}) {
    std::mutex mu;
    std::map<std::pair<size_t, size_t>, int> runs;
    std::vector<size_t> started;
    size_t done0 = 0, done0_at_start1 = 0;
    std::vector<std::string> picks(problems.size());
    step_problems(
        problems.size(), 2, 0, [] { return 0.0; },
        [&](size_t pi, int) {
          std::lock_guard<std::mutex> lock(mu);
          started.push_back(pi);
          if (pi == 1) done0_at_start1 = done0;
          return std::make_unique<ProblemSearch>(cands[pi], problems[pi], o);
        },
        [&](size_t pi, int, const ProblemSearch::Ticket& t) {
          std::this_thread::sleep_for(std::chrono::microseconds(pi == 0 ? 1000 : 100));
          std::lock_guard<std::mutex> lock(mu);
          runs[{pi, t.prop.candidate}]++;
          done0 += pi == 0;
          SearchEvaluation e;
          e.o = {true, 1.0 + 0.01 * (double)((t.prop.candidate * 7 + pi) % 13), t.prop.reps, false};
          return e;
        },
        [&](size_t pi, int, const ProblemSearch& search) { picks[pi] = search.report(nullptr).best_config; },
        with_ready ? ReadyProblem([](size_t pi, int) { return pi != 1; }) : ReadyProblem());
    size_t want = 0;
    for (const auto& c : cands) want += c.size();
    EXPECT_EQ(runs.size(), want);
    for (const auto& [key, n] : runs) EXPECT_EQ(n, 1);
    EXPECT_EQ(started, (std::vector<size_t>{0, 1, 2}));
    for (const std::string& pick : picks) EXPECT_FALSE(pick.empty());
    if (with_ready) EXPECT_GE(done0_at_start1 + 1, cands[0].size()) << "problem 1 started before problem 0's tickets";
  }
}

TEST(StepProblems, HalvingRoundsCloseWhileOtherProblemsGoOn) {
  const Stepped one = step_fa2_mma("halving", 1), two = step_fa2_mma("halving", 2);
  for (size_t pi = 0; pi < one.problems.size(); ++pi) {
    EXPECT_EQ(two.reports[pi].evaluations, two.cands[pi].size());
    EXPECT_EQ(one.reports[pi].best_config, two.reports[pi].best_config) << "problem " << pi;
  }
  // Halving evaluates the best candidates again with more repeats: more runs than candidates.
  size_t runs = 0, cands = 0;
  for (const auto& [key, n] : two.runs) runs += (size_t)n;
  for (const auto& c : two.cands) cands += c.size();
  EXPECT_GT(runs, cands);
}

// A time budget is shared out as the problems start: a budget far too short for one exhaustive problem
// still gives every problem evaluations and a pick, and no problem starts an evaluation after its part.
TEST(StepProblems, TimeBudgetIsSharedSoEveryProblemGetsAPick) {
  const Space space = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/fa2_mma.json");
  const Compiler compiler("sm_90");
  std::vector<Problem> problems;
  std::vector<std::vector<SearchCandidate>> cands;
  for (int d : {64, 128, 256, 64}) {
    Problem p;
    p.batch = 2, p.heads = 4, p.seq_q = p.seq_k = 512, p.head_dim = d, p.dtype = DType::bf16;
    p.causal = problems.size() == 3;
    problems.push_back(p);
    cands.push_back(search_candidates(space, p, compiler, Shard{}));
    ASSERT_GT(cands.back().size(), 8u);
  }
  SearchOptions o;
  o.strategy = "exhaustive";
  double clock = 0;  // one unit per evaluation; problem 1 is twice as cheap, so it leaves part of its share
  const double budget = 40;
  std::vector<size_t> evaluations(problems.size(), 0);
  std::vector<double> last_start(problems.size(), 0);
  std::vector<ProblemReport> reports(problems.size());
  step_problems(
      problems.size(), 1, budget, [&] { return clock; },
      [&](size_t pi, int) { return std::make_unique<ProblemSearch>(cands[pi], problems[pi], o); },
      [&](size_t pi, int, const ProblemSearch::Ticket& t) {
        ++evaluations[pi];
        last_start[pi] = clock;
        clock += pi == 1 ? 0.5 : 1.0;
        SearchEvaluation e;
        e.o = {true, 1.0 + 0.01 * (double)(t.prop.candidate % 7), t.prop.reps, false};
        return e;
      },
      [&](size_t pi, int, const ProblemSearch& search) { reports[pi] = search.report(nullptr); });
  // Shares when each starts: 40/4 = 10 units (0 to 10), then 30/3 = 10 units of evaluations at 0.5 (10 to 20),
  // then 20/2 (20 to 30), then the last 10 (30 to 40).
  const double ends[] = {10, 20, 30, 40};
  for (size_t pi = 0; pi < problems.size(); ++pi) {
    EXPECT_GT(evaluations[pi], 0u) << "problem " << pi;
    EXPECT_LT(evaluations[pi], cands[pi].size()) << "problem " << pi << ": the budget should have cut it";
    EXPECT_FALSE(reports[pi].best_config.empty()) << "problem " << pi;
    EXPECT_LT(last_start[pi], ends[pi]) << "problem " << pi << " started an evaluation after its share";
  }
  EXPECT_EQ(evaluations[0], 10u);
  EXPECT_EQ(evaluations[1], 20u);
  EXPECT_LE(clock, budget);
}

// ---- one median (core/timing.hpp): the worker, the sweep's re-timing and the report use it ---------------
TEST(Timing, OneMedianLiesWithinItsOwnSpread) {
  using flashtune::timing::percentile;
  EXPECT_EQ(percentile(std::vector<double>{}, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{3.0}, 0.2), 3.0);
  // Linear between the nearest ranks: an even count's median is the mean of the two middle samples.
  EXPECT_DOUBLE_EQ(percentile(std::vector<float>{4.f, 1.f, 3.f, 2.f}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{9.4, 9.5, 9.75}, 0.2), 9.44);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{9.4, 9.5, 9.75}, 0.8), 9.65);
  std::mt19937 rng(7);
  for (int n = 1; n <= 60; ++n)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> v(n);
      std::lognormal_distribution<float> d(0.f, trial % 2 ? 0.05f : 1.0f);
      for (float& x : v) x = d(rng);
      const double lo = percentile(v, 0.2), med = percentile(v, 0.5), hi = percentile(v, 0.8);
      EXPECT_LE(lo, med);
      EXPECT_LE(med, hi);
    }
  // The re-timing's pooled samples: rounds whose own medians straddle one another still give one median
  // within the pool's p20-p80 (the store once held a median of round medians beside the last round's spread).
  std::vector<double> pool = {0.2800, 0.2801, 0.2802, 0.2809, 0.2810, 0.2811, 0.2812, 0.2813, 0.2814, 0.2815};
  EXPECT_GE(percentile(pool, 0.5), percentile(pool, 0.2));
  EXPECT_LE(percentile(pool, 0.5), percentile(pool, 0.8));
}

// Early stopping cuts a candidate against the best of its own class: a reproducible (deterministic) config
// competes for the deterministic pick, so a faster non-reproducible one must not cut its timing short.
TEST(ProblemSearch, ReproducibleCandidatesAreStoppedAgainstTheirOwnBest) {
  const Family& f = *family_named("fa3_wgmma_bwd");
  Problem p;
  p.batch = 1, p.heads = 2, p.seq_q = p.seq_k = 1024, p.head_dim = 128, p.dtype = DType::bf16;
  p.direction = "bwd";
  std::vector<SearchCandidate> cands;
  for (int det : {0, 1, 1}) {  // one non-reproducible config, then two reproducible ones
    SearchCandidate c;
    c.v.family = &f;
    c.v.config = f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=0,DQ_TURNS=" +
                                std::to_string(cands.size() == 2 ? 1 : 0) +
                                ",DETERMINISTIC=" + std::to_string(det) + ",DQ_STAGES=2");
    c.v.head_dim = 128, c.v.dtype = DType::bf16;
    cands.push_back(c);
  }
  ASSERT_FALSE(f.reproducible(cands[0].v.config));
  ASSERT_TRUE(f.reproducible(cands[1].v.config));
  SearchOptions o;
  o.strategy = "exhaustive";
  ProblemSearch s(cands, p, o);
  const double ms[] = {1.0, 2.0, 1.8};
  std::map<size_t, double> bar;
  while (auto t = s.take(false)) {
    bar[t->prop.candidate] = t->stop_above_ms;
    SearchEvaluation e;
    e.o = {true, ms[t->prop.candidate], 0, false};
    s.complete(*t, e);
  }
  ASSERT_EQ(bar.size(), 3u);
  EXPECT_EQ(bar[0], 0.0) << "nothing timed yet";
  EXPECT_EQ(bar[1], 0.0) << "the first reproducible config has no reproducible best to be cut against";
  EXPECT_NEAR(bar[2], 2.0 * (1 + o.stop_margin), 1e-9) << "cut against the reproducible best, not the 1 ms one";
}
