#include "tuner/search/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/timing.hpp"
#include "core/util.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

std::string problem_key(const Problem& p) { return to_json(p).dump(); }

}  // namespace

std::vector<SearchCandidate> search_candidates(const Space& space, const Problem& p, const Compiler& compiler,
                                               const Shard& shard) {
  std::vector<SearchCandidate> out;
  for (const Variant& v : variants_for(space, {p})) {
    if (!compiler.prune_before_compile(v).empty()) continue;
    if (p.paged.enabled() && v.family->paged_check(v.config, p.paged.page_size)) continue;  // cannot read these pages
    std::string hash = compiler.variant_hash(v);
    if (!in_shard(shard, hash + '|' + problem_key(p))) continue;
    out.push_back({v, std::move(hash)});
  }
  return out;
}

// Features a strategy may use: each tunable's rank and the launch's log2 shared memory and threads, each
// scaled to [0, 1] over the problem's candidates (a constant feature is 0).
namespace {

std::vector<CandidateFeatures> features_of(const std::vector<SearchCandidate>& cs, const Problem& p) {
  std::vector<CandidateFeatures> f(cs.size());
  // A tunable's value as its rank among the values the candidates take (power-of-two sizes: their log2;
  // a mode switch: its position), so that every tunable spans [0, 1] alike.
  std::vector<std::map<int, double>> rank(cs.empty() ? 0 : cs[0].v.config.size());
  for (const auto& c : cs)
    for (size_t k = 0; k < c.v.config.size(); ++k) rank[k][c.v.config[k]] = 0;
  for (auto& r : rank) {
    double i = 0;
    for (auto& [value, x] : r) x = i++;
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    const Variant& v = cs[i].v;
    for (size_t k = 0; k < v.config.size(); ++k) f[i].x.push_back(rank[k].at(v.config[k]));
    unsigned smem = 0, threads = 0;
    for (const Launch& l : v.family->launches(v.config, p)) smem = std::max(smem, l.smem_bytes), threads = std::max(threads, l.threads);
    f[i].x.push_back(std::log2(1.0 + smem));
    f[i].x.push_back(std::log2(1.0 + threads));
  }
  if (f.empty()) return f;
  for (size_t d = 0; d < f[0].x.size(); ++d) {
    double lo = f[0].x[d], hi = lo;
    for (const auto& c : f) lo = std::min(lo, c.x[d]), hi = std::max(hi, c.x[d]);
    for (auto& c : f) c.x[d] = hi > lo ? (c.x[d] - lo) / (hi - lo) : 0.0;
  }
  return f;
}

}  // namespace

ProblemSearch::ProblemSearch(const std::vector<SearchCandidate>& cands, const Problem& p, const SearchOptions& o)
    : cands_(cands), opt_(o), features_(features_of(cands, p)) {
  rep_.problem = p;
  rep_.space_size = cands.size();
  StrategyOptions so;
  so.name = o.strategy;
  so.seed = o.seed;
  so.max_evals = o.max_evals.empty() ? 0 : parse_max_evals(o.max_evals, cands.size());
  strategy_ = make_strategy(so, features_);
}

ProblemSearch::~ProblemSearch() = default;

std::optional<ProblemSearch::Ticket> ProblemSearch::take(bool stopped) {
  std::vector<Proposal> next = stopped || exhausted_ ? std::vector<Proposal>{} : strategy_->propose(1);
  if (next.empty()) {
    // Nothing in flight can bring more proposals (halving's next round waits on this one's results).
    if (in_flight_ == 0) exhausted_ = true;
    return std::nullopt;
  }
  Ticket t{next[0], 0.0};
  const double bar = reproducible(t.prop.candidate) ? best_reproducible_ms_ : best_ms_;
  if (opt_.stop_margin > 0 && t.prop.reps == 0 && strategy_->may_stop_early(t.prop) && std::isfinite(bar))
    t.stop_above_ms = bar * (1.0 + opt_.stop_margin);
  ++in_flight_;
  return t;
}

void ProblemSearch::complete(const Ticket& t, const SearchEvaluation& e) {
  --in_flight_;
  strategy_->observe(t.prop, e.o);
  if (evaluated_.insert(t.prop.candidate).second && e.reused) ++rep_.reused;
  rep_.timing_ms += e.timing_ms;
  const int weight = t.prop.reps == 0 ? (1 << 30) : t.prop.reps;
  Measured& m = measured_[t.prop.candidate];
  if (weight >= m.weight) m = {e.o, weight};
  if (e.o.ok && !e.o.early_stopped && t.prop.reps == 0) {
    best_ms_ = std::min(best_ms_, e.o.ms);
    if (reproducible(t.prop.candidate)) best_reproducible_ms_ = std::min(best_reproducible_ms_, e.o.ms);
  }
}

bool ProblemSearch::reproducible(size_t candidate) const {
  const Variant& v = cands_[candidate].v;
  return v.family->reproducible && v.family->reproducible(v.config);
}

ProblemReport ProblemSearch::report(std::vector<std::pair<double, size_t>>* ranking) const {
  ProblemReport rep = rep_;
  rep.evaluations = evaluated_.size();
  // The pick: the fastest fully timed success (an early-stopped one only when nothing else succeeded).
  long best = -1;
  for (const auto& [c, m] : measured_) {
    if (!m.o.ok) continue;
    if (best < 0) {
      best = (long)c;
      continue;
    }
    const Measured& b = measured_.at((size_t)best);
    const bool full = !m.o.early_stopped, b_full = !b.o.early_stopped;
    if ((full && !b_full) || (full == b_full && m.o.ms < b.o.ms)) best = (long)c;
  }
  if (ranking) {
    ranking->clear();
    for (const auto& [c, m] : measured_)
      if (m.o.ok && !m.o.early_stopped) ranking->push_back({m.o.ms, c});
    std::sort(ranking->begin(), ranking->end());
  }
  if (best >= 0) {
    const SearchCandidate& c = cands_[(size_t)best];
    rep.best_config = c.v.family->config_string(c.v.config);
    rep.best_ms = measured_.at((size_t)best).o.ms;
    rep.best_tflops = rep.problem.flops() / (rep.best_ms * 1e-3) / 1e12;
  }
  return rep;
}

ProblemReport search_problem(const std::vector<SearchCandidate>& cands, const Problem& p, const SearchOptions& o,
                             const SearchEvaluate& evaluate, double deadline, const std::function<double()>& clock) {
  ProblemReport rep;
  step_problems(
      1, 1, deadline, clock, [&](size_t, int) { return std::make_unique<ProblemSearch>(cands, p, o); },
      [&](size_t, int w, const ProblemSearch::Ticket& t) { return evaluate(w, t.prop.candidate, t.prop, t.stop_above_ms); },
      [&](size_t, int, const ProblemSearch& search) { rep = search.report(nullptr); });
  return rep;
}

namespace {
struct ReplayRow {
  std::string status;
  double ms = 0, p20 = 0, p80 = 0, tflops = 0;
};
}  // namespace

json ProblemReport::to_json() const {
  json j = {{"problem", flashtune::to_json(problem)},
            {"space_size", space_size},
            {"evaluations", evaluations},
            {"reused", reused},
            {"timing_ms", timing_ms},
            {"best_config", best_config},
            {"best_found_ms", best_ms},
            {"best_found_tflops", best_tflops}};
  j["exhaustive_best_tflops"] = exhaustive_best_tflops >= 0 ? json(exhaustive_best_tflops) : json(nullptr);
  j["exhaustive_timing_ms"] = exhaustive_timing_ms >= 0 ? json(exhaustive_timing_ms) : json(nullptr);
  return j;
}

Shard parse_shard(const std::string& text) {
  const auto parts = split(text, '/');
  const std::string bad = "--shard must be k/n with 0 <= k < n <= 4096, got '" + brief(text) + "'";
  if (parts.size() != 2) throw UsageError(bad);
  int v[2];
  for (int i = 0; i < 2; ++i) {
    if (parts[i].empty() || parts[i].size() > 4 || parts[i].find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(bad);
    v[i] = std::stoi(parts[i]);
  }
  if (v[1] < 1 || v[1] > 4096 || v[0] >= v[1]) throw UsageError(bad);
  return {v[0], v[1]};
}

bool in_shard(const Shard& s, const std::string& key) {
  if (s.all()) return true;
  const std::string h = content_hash(key);
  return std::stoull(h.substr(0, 15), nullptr, 16) % (unsigned long long)s.count == (unsigned long long)s.index;
}

std::vector<ProblemReport> replay_search(const Space& space, const std::vector<Problem>& problems,
                                         const std::string& db, const std::string& device, const SearchOptions& o) {
  Store store(db, Store::Mode::read_only);
  ResultFilter f;
  f.family = space.family->name;
  f.device = device;
  std::vector<ResultRecord> rows = store.results(f);
  if (device.empty()) {  // the device with the most rows of this family
    std::map<std::string, size_t> count;
    for (const auto& r : rows) ++count[r.device_name];
    std::string most;
    for (const auto& [name, n] : count)
      if (most.empty() || n > count[most]) most = name;
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const ResultRecord& r) { return r.device_name != most; }),
               rows.end());
  }
  if (rows.empty())
    throw UsageError("'" + db + "' holds no " + space.family->name + " results" + (device.empty() ? "" : " on " + device));
  const std::string arch = rows[0].arch;
  arch_limits(arch);  // a stored arch we do not know is refused in one line
  std::map<std::pair<std::string, std::string>, ReplayRow> by_key;  // (config, problem) -> the latest row
  for (const auto& r : rows)
    by_key[{r.config, problem_key(r.problem)}] = {r.status, r.ms_median, r.ms_p20, r.ms_p80, r.tflops};

  const Compiler compiler(arch);
  double simulated = 0;  // timing time over the whole replay, for --time-budget
  std::vector<ProblemReport> out;
  for (const Problem& p : problems) {
    const std::vector<SearchCandidate> cands = search_candidates(space, p, compiler, o.shard);
    if (cands.empty()) continue;
    std::vector<const ReplayRow*> row(cands.size(), nullptr);
    double exhaustive_best = 0, exhaustive_time = 0;
    bool complete = true;
    for (size_t i = 0; i < cands.size(); ++i) {
      auto it = by_key.find({cands[i].v.family->config_string(cands[i].v.config), problem_key(p)});
      if (it == by_key.end()) {
        complete = false;
        continue;
      }
      row[i] = &it->second;
      if (it->second.status == "ok") {
        exhaustive_best = std::max(exhaustive_best, it->second.tflops);
        exhaustive_time += (timing::kWarmup + timing::default_reps(it->second.ms)) * it->second.ms;
      }
    }
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + out.size());
    SearchEvaluate evaluate = [&](int, size_t c, const Proposal& prop, double stop_above) {
      SearchEvaluation e;
      const ReplayRow* r = row[c];
      if (!r || r->status != "ok" || !(r->ms > 0)) return e;  // missing, pruned, invalid, crashed: a failure
      // The median of n repeats scatters around the stored median by about 1.25 sigma / sqrt(n), with
      // sigma the per-launch spread the stored p20-p80 range implies (a normal's: 1.68 sigma).
      const double sigma = std::max(0.0, r->p80 - r->p20) / 1.683;
      int reps = prop.reps ? prop.reps : timing::default_reps(r->ms);
      const int warmup = prop.warmup >= 0 ? prop.warmup : timing::kWarmup;
      std::normal_distribution<double> noise(0.0, 1.0);
      if (stop_above > 0 && prop.reps == 0) {  // early stop after 3 repeats, as the worker does
        const double first = r->ms + 1.2533 * sigma / std::sqrt(3.0) * noise(rng);
        if (first > stop_above) {
          e.o = {true, first, 3, true};
          e.timing_ms = (warmup + 3) * r->ms;
          return e;
        }
      }
      e.o = {true, std::max(1e-6, r->ms + 1.2533 * sigma / std::sqrt((double)reps) * noise(rng)), reps, false};
      e.timing_ms = (warmup + reps) * r->ms;
      return e;
    };
    SearchEvaluate counted = [&](int w, size_t c, const Proposal& prop, double stop_above) {
      SearchEvaluation e = evaluate(w, c, prop, stop_above);
      simulated += e.timing_ms;
      return e;
    };
    // The budget shared out as the sweep does: this problem's equal part of what is left.
    const double left = (double)(problems.size() - (size_t)(&p - problems.data()));
    const double deadline = o.time_budget_s > 0 ? simulated + std::max(0.0, o.time_budget_s * 1e3 - simulated) / left : 0;
    ProblemReport rep = search_problem(cands, p, o, counted, deadline, [&] { return simulated; });
    // Replay reports the pick at its stored speed, not at the noisy figure that picked it.
    for (size_t i = 0; i < cands.size(); ++i)
      if (row[i] && cands[i].v.family->config_string(cands[i].v.config) == rep.best_config) {
        rep.best_tflops = row[i]->tflops;
        rep.best_ms = row[i]->ms;
      }
    if (complete) {
      rep.exhaustive_best_tflops = exhaustive_best;
      rep.exhaustive_timing_ms = exhaustive_time;
    }
    out.push_back(rep);
  }
  return out;
}

}  // namespace flashtune

namespace flashtune {

void step_problems(size_t problems, int workers, double deadline, const std::function<double()>& clock,
                   const StartProblem& start, const EvaluateTicket& evaluate, const FinishProblem& finish,
                   const ReadyProblem& ready) {
  struct Run {
    std::unique_ptr<ProblemSearch> search;
    bool finishing = false;  // a worker took its finish
    double deadline = 0;     // its share of the budget ends here (0: no budget)
  };
  std::vector<Run> runs(problems);
  std::mutex mu;
  std::condition_variable cv;
  size_t next_problem = 0;
  auto work = [&](int w) {
    std::unique_lock<std::mutex> lock(mu);
    size_t mine = problems;  // the problem this worker last stepped
    for (;;) {
      const double now = clock();
      std::optional<ProblemSearch::Ticket> ticket;
      size_t pi = problems;
      bool finishing = false;
      auto pick = [&](size_t i) {
        Run& r = runs[i];
        if (!r.search || r.finishing) return false;
        if ((ticket = r.search->take(r.deadline > 0 && now >= r.deadline))) {
          pi = i;
          return true;
        }
        if (r.search->finished()) {
          r.finishing = finishing = true;
          pi = i;
          return true;
        }
        return false;
      };
      auto start_next = [&] {
        const size_t i = next_problem++;
        // A budget is shared out as the problems start: each gets an equal part of what is left (with
        // several workers, of what is left times the workers that can run problems side by side), so
        // every problem gets a pick and what one leaves unspent goes to the next.
        if (deadline > 0) {
          const double left = (double)(problems - i), side_by_side = std::min<double>(workers, left);
          runs[i].deadline = now + std::max(0.0, deadline - now) * side_by_side / left;
        }
        runs[i].search = start(i, w);
        return pick(i);
      };
      // The worker's own problem first (its inputs and reference are prepared there), then the next
      // problem not started, then any problem with an evaluation to share; with `ready`, first those of
      // them that wait for nothing.
      bool found = mine < problems && pick(mine);
      if (ready) {
        while (!found && next_problem < problems && ready(next_problem, w)) found = start_next();
        for (size_t i = 0; !found && i < next_problem; ++i) found = ready(i, w) && pick(i);
      }
      while (!found && next_problem < problems) found = start_next();
      for (size_t i = 0; !found && i < next_problem; ++i) found = pick(i);
      if (!found) {
        bool all_done = next_problem == problems;
        for (size_t i = 0; all_done && i < problems; ++i) all_done = !runs[i].search || runs[i].finishing;
        if (all_done) break;
        cv.wait(lock);
        continue;
      }
      mine = pi;
      ProblemSearch& search = *runs[pi].search;
      lock.unlock();
      if (finishing) {
        finish(pi, w, search);  // nothing else touches a finished search
        lock.lock();
      } else {
        const SearchEvaluation e = evaluate(pi, w, *ticket);
        lock.lock();
        search.complete(*ticket, e);
      }
      cv.notify_all();
    }
    cv.notify_all();
  };
  if (workers <= 1) {
    work(0);
  } else {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back(work, w);
    for (auto& t : threads) t.join();
  }
}

}  // namespace flashtune
