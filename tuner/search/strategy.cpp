#include "tuner/search/strategy.hpp"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "core/util.hpp"

namespace flashtune {

namespace {

size_t budget_of(const StrategyOptions& o, size_t n) { return o.max_evals ? std::min(o.max_evals, n) : n; }

// Every candidate once with the worker's repeats, in the given order, up to the budget.
class Listed : public Strategy {
 public:
  Listed(std::vector<size_t> order, size_t budget) : order_(std::move(order)) {
    if (order_.size() > budget) order_.resize(budget);
  }
  std::vector<Proposal> propose(size_t n) override {
    std::vector<Proposal> out;
    while (out.size() < n && next_ < order_.size()) out.push_back({order_[next_++], 0, -1});
    return out;
  }
  void observe(const Proposal&, const Outcome&) override {}

 private:
  std::vector<size_t> order_;
  size_t next_ = 0;
};

// Successive halving: every candidate timed with 2 repeats, the best quarter again with 8, the last
// three with the worker's full timing. Cheap rounds rank, the full round measures: most of the space
// costs 2 launches instead of 13-53. The cheap rounds skip the warm-up: the worker's validated launch
// of the same kernel on the same inputs comes just before the timing.
class Halving : public Strategy {
 public:
  // The first round in a seeded random order (a --max-evals budget: its first `budget`), never the space's own
  // order: a --time-budget that stops the round keeps what it measured, and in the space's order that was one corner
  // of it (on the H200 the main job's share timed BLOCK_M 64 alone at d 64 S 16k, where 128 is 8% faster).
  Halving(size_t n, size_t budget, uint64_t seed) {
    std::vector<size_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min(budget, n));
    start_round(std::move(all));
  }
  std::vector<Proposal> propose(size_t n) override {
    std::vector<Proposal> out;
    if (next_ == alive_.size() && observed_ == alive_.size()) advance();
    while (out.size() < n && next_ < alive_.size()) out.push_back({alive_[next_++], reps(), final() ? -1 : 0});
    return out;
  }
  void observe(const Proposal& p, const Outcome& o) override {
    ++observed_;
    if (o.ok) ms_[p.candidate] = o.ms;
  }
  bool may_stop_early(const Proposal&) const override { return false; }

 private:
  static constexpr int kEta = 4, kFinalists = 3;
  static constexpr int kReps[] = {2, 8};
  bool final() const { return round_ >= (int)std::size(kReps); }
  int reps() const { return final() ? 0 : kReps[round_]; }
  void start_round(std::vector<size_t> alive) {
    alive_ = std::move(alive);
    next_ = observed_ = 0;
    ms_.clear();
  }
  void advance() {
    if (final() || alive_.empty()) {
      alive_.clear();
      next_ = observed_ = 0;
      return;
    }
    std::vector<size_t> ok;
    for (size_t c : alive_)
      if (ms_.count(c)) ok.push_back(c);
    std::sort(ok.begin(), ok.end(), [&](size_t a, size_t b) { return ms_[a] < ms_[b]; });
    size_t keep = std::max<size_t>(kFinalists, (ok.size() + kEta - 1) / kEta);
    ++round_;
    if (ok.size() <= (size_t)kFinalists) round_ = (int)std::size(kReps);  // straight to the full timing
    if (final()) keep = kFinalists;
    ok.resize(std::min(keep, ok.size()));
    start_round(std::move(ok));
  }
  std::vector<size_t> alive_;
  size_t next_ = 0, observed_ = 0;
  int round_ = 0;
  std::map<size_t, double> ms_;
};

// Model-guided search: a space-filling start, then the candidate a nearest-neighbour model of the
// observed log-times predicts fastest, less an exploration bonus for distance from everything seen
// (shrinking to nothing as the budget is spent). A failed candidate counts as slower than any seen.
class Guided : public Strategy {
 public:
  Guided(const std::vector<CandidateFeatures>& f, size_t budget, uint64_t seed)
      : f_(f), budget_(std::min(budget, f.size())), rng_(seed), y_(f.size(), kUnseen), proposed_(f.size(), false) {
    start_ = std::min(budget_, std::max<size_t>(2, budget_ / 4));
  }

  std::vector<Proposal> propose(size_t n) override {
    std::vector<Proposal> out;
    while (out.size() < n && issued_ < budget_) {
      const size_t c = issued_ < start_ ? farthest() : most_promising();
      if (c == npos) break;
      proposed_[c] = true;
      ++issued_;
      out.push_back({c, 0, -1});
    }
    return out;
  }

  void observe(const Proposal& p, const Outcome& o) override {
    y_[p.candidate] = o.ok ? std::log(o.ms) : kFailed;
    seen_.push_back(p.candidate);
  }

 private:
  static constexpr double kUnseen = std::numeric_limits<double>::quiet_NaN();
  static constexpr double kFailed = std::numeric_limits<double>::infinity();
  static constexpr size_t npos = ~size_t{0};

  double dist(size_t a, size_t b) const {
    double s = 0;
    for (size_t i = 0; i < f_[a].x.size(); ++i) s += (f_[a].x[i] - f_[b].x[i]) * (f_[a].x[i] - f_[b].x[i]);
    return std::sqrt(s);
  }
  // Farthest-point sampling over what has been proposed (a random first point).
  size_t farthest() {
    std::vector<size_t> open;
    for (size_t c = 0; c < f_.size(); ++c)
      if (!proposed_[c]) open.push_back(c);
    if (open.empty()) return npos;
    bool any = false;
    for (size_t c = 0; c < f_.size(); ++c) any |= proposed_[c];
    if (!any) return open[std::uniform_int_distribution<size_t>(0, open.size() - 1)(rng_)];
    size_t best = npos;
    double best_d = -1;
    for (size_t c : open) {
      double d = std::numeric_limits<double>::infinity();
      for (size_t s = 0; s < f_.size(); ++s)
        if (proposed_[s]) d = std::min(d, dist(c, s));
      d += 1e-9 * std::uniform_real_distribution<double>(0, 1)(rng_);  // random among ties
      if (d > best_d) best_d = d, best = c;
    }
    return best;
  }
  size_t most_promising() {
    // Failed candidates: one worse than the slowest success, so the model steers away from them.
    double worst = -std::numeric_limits<double>::infinity(), sum = 0, sum2 = 0;
    int n_ok = 0;
    for (size_t s : seen_)
      if (std::isfinite(y_[s])) worst = std::max(worst, y_[s]), sum += y_[s], sum2 += y_[s] * y_[s], ++n_ok;
    if (n_ok == 0) return farthest();
    const double mean = sum / n_ok, spread = std::sqrt(std::max(1e-6, sum2 / n_ok - mean * mean));
    auto value = [&](size_t s) { return std::isfinite(y_[s]) ? y_[s] : worst + std::max(0.5, spread); };
    // Exploration weight: from 1 (in units of the observed spread per unit of feature distance) down
    // to 0 at the end of the budget.
    const double left = 1.0 - (double)issued_ / (double)budget_;
    const double kappa = 1.0 * left;
    size_t best = npos;
    double best_a = std::numeric_limits<double>::infinity();
    constexpr int K = 4;
    std::vector<std::pair<double, size_t>> near;
    for (size_t c = 0; c < f_.size(); ++c) {
      if (proposed_[c]) continue;
      near.clear();
      for (size_t s : seen_) near.push_back({dist(c, s), s});
      const size_t k = std::min<size_t>(K, near.size());
      std::partial_sort(near.begin(), near.begin() + k, near.end());
      double w_sum = 0, pred = 0;
      for (size_t i = 0; i < k; ++i) {
        const double w = 1.0 / (near[i].first * near[i].first + 1e-3);
        w_sum += w;
        pred += w * value(near[i].second);
      }
      pred /= w_sum;
      const double a = pred - kappa * spread * near[0].first +
                       1e-9 * std::uniform_real_distribution<double>(0, 1)(rng_);
      if (a < best_a) best_a = a, best = c;
    }
    return best;
  }

  const std::vector<CandidateFeatures>& f_;
  size_t budget_, start_, issued_ = 0;
  std::mt19937_64 rng_;
  std::vector<double> y_;
  std::vector<bool> proposed_;
  std::vector<size_t> seen_;
};

}  // namespace

size_t planned_evaluations(const StrategyOptions& o, size_t n) {
  const size_t b = budget_of(o, n);
  if (o.name != "halving") return b;
  const size_t second = b <= 3 ? 0 : std::max<size_t>(3, (b + 3) / 4);  // Halving's cut (kEta = 4)
  return b + second + std::min<size_t>(3, b);
}

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = {"exhaustive", "random", "halving", "guided"};
  return names;
}

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& o, const std::vector<CandidateFeatures>& f) {
  const size_t n = f.size(), budget = budget_of(o, n);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (o.name == "exhaustive") return std::make_unique<Listed>(order, budget);
  if (o.name == "random") {
    std::mt19937_64 rng(o.seed);
    std::shuffle(order.begin(), order.end(), rng);
    return std::make_unique<Listed>(order, budget);
  }
  if (o.name == "halving") return std::make_unique<Halving>(n, budget, o.seed);
  if (o.name == "guided") return std::make_unique<Guided>(f, budget, o.seed);
  throw UsageError("unknown --strategy '" + brief(o.name) + "' (exhaustive, random, halving or guided)");
}

size_t parse_max_evals(const std::string& text, size_t space) {
  const bool pct = !text.empty() && text.back() == '%';
  const std::string num = pct ? text.substr(0, text.size() - 1) : text;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(num.c_str(), &end);
  if (num.empty() || *end || errno || !std::isfinite(v) || v <= 0 || (pct && v > 100) || (!pct && v != std::floor(v)) ||
      v > 1e9)
    throw UsageError("--max-evals must be a count (e.g. 40) or a percentage of the space (e.g. 25%), got '" +
                     brief(text) + "'");
  if (!pct) return (size_t)v;
  return std::max<size_t>(1, (size_t)std::floor(v / 100.0 * (double)space + 1e-9));  // never over the share
}

double parse_duration(const std::string& text) {
  const std::string bad = "--time-budget must be a duration such as 10m, 90s, 1h or 1h30m, got '" + brief(text) + "'";
  if (text.empty() || text.size() > 32) throw UsageError(bad);
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && (std::isdigit((unsigned char)text[j]) || text[j] == '.')) ++j;
    if (j == i) throw UsageError(bad);
    char* end = nullptr;
    const std::string num = text.substr(i, j - i);
    const double v = std::strtod(num.c_str(), &end);
    if (*end || !std::isfinite(v)) throw UsageError(bad);
    double unit = 1;
    if (j < text.size()) {
      const char u = text[j++];
      unit = u == 'h' ? 3600 : u == 'm' ? 60 : u == 's' ? 1 : -1;
      if (unit < 0) throw UsageError(bad);
    } else if (any) {
      throw UsageError(bad);  // "1h30": a bare number only alone
    }
    total += v * unit;
    any = true;
    i = j;
  }
  if (!(total > 0) || total > 30 * 86400.0) throw UsageError(bad);
  return total;
}

}  // namespace flashtune
